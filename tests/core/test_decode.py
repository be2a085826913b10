"""core/decode.py: the decoder chosen per device, its fallbacks (logged once, with the reason), bad images refused
by every decoder this machine has, and on a GPU the hardware path against the CPU's pixels."""

from __future__ import annotations

import io
import logging

import pytest
import torch
from PIL import Image

from tests.conftest import requires_cuda
from yolov9.core.decode import DECODERS, _pick, decode_cpu, decode_images, pick_decoder
from yolov9.core.image_io import ImageError
from yolov9.core.paths import sample_images


def _jpegs() -> list[bytes]:
    return [f.read_bytes() for f in sorted(sample_images()) if f.suffix == ".jpg"]


def _variants(good: bytes) -> dict[str, bytes]:
    """Files a hardware JPEG decoder refuses but the CPU reads, and files nobody reads."""
    im = Image.open(io.BytesIO(good))
    out = {}
    for name, mode, kw in (("cmyk", "CMYK", {}), ("progressive", "RGB", {"progressive": True}), ("gray", "L", {})):
        buf = io.BytesIO()
        im.convert(mode).save(buf, "JPEG", **kw)
        out[name] = buf.getvalue()
    png = io.BytesIO()
    im.save(png, "PNG")
    out["png"] = png.getvalue()
    return out


BAD = {"garbage after a JPEG marker": b"\xff\xd8" + b"x" * 300, "not an image": b"junk" * 20, "empty": b""}


def _available_decoders() -> list[str]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return sorted({pick_decoder(device, name).name for name in DECODERS})


def test_the_cpu_decodes_on_the_cpu():
    assert pick_decoder("cpu").name == "cpu"
    assert pick_decoder("cpu", "auto") is pick_decoder("cpu")  # chosen once per device


def test_a_decoder_that_cannot_run_falls_back_with_the_reason_logged_once(caplog):
    _pick.cache_clear()
    with caplog.at_level(logging.WARNING, logger="yolov9.decode"):
        first = pick_decoder("cpu", "nvimgcodec")
        again = pick_decoder("cpu", "nvimgcodec")
    assert first.name == again.name == "cpu"
    lines = [r.getMessage() for r in caplog.records if r.name == "yolov9.decode"]
    # nvImageCodec: not installed, or installed but no CUDA device here; then torchvision's nvJPEG: no CUDA device
    assert len(lines) == 2, lines
    assert lines[0].startswith("decoder nvimgcodec unavailable on cpu: ") and lines[0].endswith("trying nvjpeg")
    assert "not installed" in lines[0] or "CUDA device" in lines[0]
    assert lines[1] == "decoder nvjpeg unavailable on cpu: decodes on a CUDA device, not cpu; trying cpu"


def test_an_unknown_decoder_is_refused():
    with pytest.raises(ValueError, match="choose auto or one of nvimgcodec, nvjpeg, cpu"):
        pick_decoder("cpu", "libjpeg")


@pytest.mark.parametrize("name", _available_decoders())
def test_bad_images_are_refused_in_place_by_every_decoder(name):
    device = "cuda" if torch.cuda.is_available() and name != "cpu" else "cpu"
    decoder = pick_decoder(device, name)
    assert decoder.name == name
    good = _jpegs()[0]
    blobs = [good, *BAD.values(), *_variants(good).values(), good]
    out = decode_images(blobs, device, decoder)
    ref = decode_cpu(good)
    assert out[0].shape == ref.shape and out[0].dtype == torch.uint8 and out[0].device.type == device
    assert torch.equal(out[0], out[-1])
    for k, what in enumerate(BAD, start=1):
        assert isinstance(out[k], ImageError), what
    for img, (what, data) in zip(out[1 + len(BAD) : -1], _variants(good).items()):
        assert not isinstance(img, ImageError), what
        assert img.shape == decode_cpu(data).shape, what


@requires_cuda
def test_nvimgcodec_matches_the_cpu_decoder_within_jpeg_tolerance():
    decoder = pick_decoder("cuda", "nvimgcodec")
    if decoder.name != "nvimgcodec":
        pytest.skip("nvImageCodec does not run here (pip install yolov9-trt[gpu]; the reason is logged above)")
    blobs = _jpegs()
    out = decoder(blobs)
    for data, img in zip(blobs, out):
        ref = decode_cpu(data).cuda()
        assert img.shape == ref.shape and img.device.type == "cuda"
        diff = (img.int() - ref.int()).abs()
        # same IDCT family as libjpeg: off by one level at most, almost nowhere
        assert diff.max() <= 2 and diff.float().mean() < 0.05


@requires_cuda
def test_auto_takes_nvjpeg_on_the_gpu_and_nvimgcodec_when_asked():
    assert pick_decoder("cuda").name == "nvjpeg"
    try:
        import nvidia.nvimgcodec  # noqa: F401
    except ImportError:
        pytest.skip("nvImageCodec is not installed (pip install yolov9-trt[gpu])")
    assert pick_decoder("cuda", "nvimgcodec").name == "nvimgcodec"
