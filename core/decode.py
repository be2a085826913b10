"""Image decoding: the one place every path decodes (training data, validation, predict, export checks, the Triton
model, the benchmarks). Encoded bytes -> uint8 RGB (3, H, W) on the device asked for.

On a CUDA device JPEGs go to nvImageCodec (the GPU's hardware JPEG engines, then its CUDA decoder, then its CPU
decoder, per image), to torchvision's batched nvJPEG (on the GPU's CUDA cores, which the engine also needs), or to
the CPU; the first of these, from the one asked for ('auto': AUTO_CUDA), that imports and decodes a probe image on
that device is used, and each one passed over is logged once with the reason. Other formats, and every decode on
the CPU, go through torchvision, with PIL for the files torchvision refuses. A JPEG a GPU decoder cannot take (CMYK
and progressive files on the hardware engine) is decoded by the CPU path instead, and a corrupt one gives its
ImageError in place."""

from __future__ import annotations

import io
import logging
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from yolov9.core.errors import Unavailable
from yolov9.core.image_io import ImageError, image_size

log = logging.getLogger("yolov9.decode")

DECODERS = ("nvimgcodec", "nvjpeg", "cpu")  # a named decoder falls back along this order
# where 'auto' starts on a CUDA device: nvJPEG decoded a serving batch faster than nvImageCodec's hardware path in
# one process on an H200 (docs/benchmarks.md); under many instances, where the CUDA cores are the bottleneck, the
# hardware engines may pay, so nvimgcodec is there to be chosen (--decoder nvimgcodec) until that is measured
AUTO_CUDA = "nvjpeg"
NVIMGCODEC_PACKAGES = "nvidia-nvimgcodec-cu13 nvidia-nvjpeg"  # pip install yolov9-trt[gpu]


# encoded image bytes: a memoryview is a buffer owned by someone else (a Triton request's input), read in place
Encoded = bytes | memoryview


def is_jpeg(data: Encoded) -> bool:
    return data[:2] == b"\xff\xd8"


def as_uint8(data: Encoded) -> torch.Tensor:
    """The bytes as a 1-D uint8 tensor: a writable buffer is shared, not copied; immutable bytes are copied once
    (torch writes nowhere, but refuses to wrap a read-only buffer without a warning)."""
    if isinstance(data, memoryview) and not data.readonly:
        return torch.frombuffer(data, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def decode_cpu(data: Encoded) -> torch.Tensor:
    """torchvision's decoder, then PIL for what it refuses (truncated-but-readable JPEGs, palette PNGs)."""
    import torchvision  # imported at first use: see decode_image

    raw = as_uint8(data)
    try:
        return torchvision.io.decode_image(raw, mode=torchvision.io.ImageReadMode.RGB)
    except Exception:
        try:
            with Image.open(io.BytesIO(data)) as im:
                return torch.from_numpy(np.asarray(im.convert("RGB")).copy()).permute(2, 0, 1)
        except Exception:
            raise ImageError("image data is corrupt or truncated") from None


class CpuDecoder:
    name = "cpu"

    def __init__(self, device: torch.device):
        self.device = device

    def decode_one(self, data: Encoded) -> torch.Tensor | ImageError:
        try:
            return decode_cpu(data).to(self.device)
        except ImageError as e:
            return e

    def __call__(self, blobs: list[Encoded]) -> list[torch.Tensor | ImageError]:
        return [self.decode_one(b) for b in blobs]


class NvjpegDecoder(CpuDecoder):
    """torchvision's nvJPEG: all JPEGs of a call in one batched decode on the CUDA cores."""

    name = "nvjpeg"

    def __init__(self, device: torch.device):
        if device.type != "cuda":
            raise Unavailable(f"decodes on a CUDA device, not {device}")
        super().__init__(device)
        if isinstance(self._jpegs([_probe_jpeg()])[0], ImageError):
            raise Unavailable("the probe image did not decode")

    def _jpegs(self, blobs: list[Encoded]) -> list[torch.Tensor | ImageError]:
        import torchvision  # imported at first use: see decode_image

        raws = [as_uint8(b) for b in blobs]
        try:
            return torchvision.io.decode_jpeg(raws, mode=torchvision.io.ImageReadMode.RGB, device=self.device)
        except Exception:  # one bad JPEG fails the batched call: decode them one by one instead
            return [self.decode_one(b) for b in blobs]

    def __call__(self, blobs: list[Encoded]) -> list[torch.Tensor | ImageError]:
        return _split_jpegs(blobs, self._jpegs, self.decode_one)


class NvImageCodecDecoder(CpuDecoder):
    """nvImageCodec: the hardware JPEG engines first (A100, H100, H200 have them), its CUDA decoder for what they
    refuse, its CPU decoder after that; planar RGB straight into device memory on torch's current stream.
    `chunk`: images per decode call (the hardware path was faster in calls of 8 than of 64 on an H200)."""

    name = "nvimgcodec"

    def __init__(self, device: torch.device, chunk: int = 8):
        try:
            import nvidia.nvimgcodec as nvimgcodec
        except ModuleNotFoundError as e:
            if e.name not in ("nvidia", "nvidia.nvimgcodec"):
                raise Unavailable(f"its import failed: {e}") from None
            raise Unavailable(f"not installed (pip install {NVIMGCODEC_PACKAGES})") from None
        except ImportError as e:  # installed, but its library did not load
            raise Unavailable(f"its import failed: {str(e).splitlines()[0]}") from None
        if device.type != "cuda":
            raise Unavailable(f"decodes on a CUDA device, not {device}")
        super().__init__(device)
        self.chunk, self.nv = chunk, nvimgcodec
        kinds = (nvimgcodec.BackendKind.HW_GPU_ONLY, nvimgcodec.BackendKind.GPU_ONLY, nvimgcodec.BackendKind.CPU_ONLY)
        try:
            self.decoder = nvimgcodec.Decoder(
                device_id=device.index if device.index is not None else torch.cuda.current_device(),
                backends=[nvimgcodec.Backend(k) for k in kinds],
            )
        except Exception as e:
            raise Unavailable(f"no decoder on {device}: {str(e).splitlines()[0]}") from None
        # the other decoders leave EXIF orientation alone (training labels are in the stored orientation)
        self.params = nvimgcodec.DecodeParams(
            apply_exif_orientation=False, color_spec=nvimgcodec.ColorSpec.SRGB, sample_format=nvimgcodec.P_RGB
        )
        if isinstance(self._jpegs([_probe_jpeg()])[0], ImageError):
            raise Unavailable("the probe image did not decode (is libnvjpeg installed? pip install nvidia-nvjpeg)")

    def _jpegs(self, blobs: list[Encoded]) -> list[torch.Tensor | ImageError]:
        stream = torch.cuda.current_stream(self.device).cuda_stream
        out: list[torch.Tensor | ImageError] = []
        for i in range(0, len(blobs), self.chunk):
            part = blobs[i : i + self.chunk]
            try:
                images = self.decoder.decode(
                    [self.nv.CodeStream(bytes(b)) for b in part], params=self.params, cuda_stream=stream
                )
            except Exception:
                images = [None] * len(part)
            for data, im in zip(part, images):
                # the tensor keeps the nvImageCodec image (its memory) alive; None: a file it could not decode
                out.append(self.decode_one(data) if im is None else torch.as_tensor(im, device=self.device))
        return out

    def __call__(self, blobs: list[Encoded]) -> list[torch.Tensor | ImageError]:
        return _split_jpegs(blobs, self._jpegs, self.decode_one)


def _split_jpegs(blobs, decode_jpegs, decode_other) -> list:
    """JPEGs to the batched decoder, everything else one by one, results in the order given."""
    out: list = [None] * len(blobs)
    jpegs = [k for k, b in enumerate(blobs) if is_jpeg(b)]
    for k, b in enumerate(blobs):
        if not is_jpeg(b):
            out[k] = decode_other(b)
    if jpegs:
        for k, img in zip(jpegs, decode_jpegs([blobs[k] for k in jpegs])):
            out[k] = img
    return out


_KINDS = {"nvimgcodec": NvImageCodecDecoder, "nvjpeg": NvjpegDecoder, "cpu": CpuDecoder}


def pick_decoder(device: str | torch.device = "cpu", prefer: str = "auto") -> CpuDecoder:
    """The first decoder of DECODERS (from `prefer` on; 'auto': from the first on a CUDA device, the CPU decoder
    elsewhere) that works on `device`; the CPU decoder always does. Chosen once per device and preference; each one
    passed over is logged once, with why."""
    if prefer != "auto" and prefer not in _KINDS:
        raise ValueError(f"decoder {prefer!r}: choose auto or one of {', '.join(DECODERS)}")
    return _pick(str(torch.device(device)), prefer)


@lru_cache
def _pick(device: str, prefer: str) -> CpuDecoder:
    dev = torch.device(device)
    if prefer == "auto":
        names = DECODERS[DECODERS.index(AUTO_CUDA) :] if dev.type == "cuda" else ("cpu",)
    else:
        names = DECODERS[DECODERS.index(prefer) :]
    for name, then in zip(names, names[1:]):
        try:
            return _KINDS[name](dev)
        except Unavailable as e:
            log.warning("decoder %s unavailable on %s: %s; trying %s", name, dev, e, then)
    return CpuDecoder(dev)


def decode_images(
    blobs: list[Encoded], device: str | torch.device = "cpu", decoder: CpuDecoder | None = None
) -> list[torch.Tensor | ImageError]:
    """Several encoded images at once, header-checked first (size limit, format); a bad image yields its
    ImageError in place, so the others still decode."""
    decoder = decoder or pick_decoder(str(device))
    out: list = [None] * len(blobs)
    ok = []
    for k, data in enumerate(blobs):
        try:
            image_size(data)
            ok.append(k)
        except ImageError as e:
            out[k] = e
    for k, img in zip(ok, decoder([blobs[k] for k in ok]) if ok else []):
        out[k] = img
    return out


def decode_image(data: bytes | Path | str, device: str | torch.device = "cpu") -> torch.Tensor:
    """One encoded image (bytes or a file) -> uint8 RGB (3, H, W) on `device`; raises ImageError.

    torchvision is imported where it is first used, here and in NMS, not with this module: its import (with the
    torch._dynamo it pulls in) takes seconds, and the trainer makes it in its data thread beside the GPU's
    warm-up rather than before the run's first step."""
    if isinstance(data, (str, Path)):
        data = Path(data).read_bytes()
    (img,) = decode_images([data], device)
    if isinstance(img, ImageError):
        raise img
    return img


@lru_cache
def _probe_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 90)).save(buf, "JPEG")
    return buf.getvalue()
