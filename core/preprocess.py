"""Letterboxing (decoding is core/decode.py): the one pre-processing path used by validation, prediction, export
checks and the server (on the CPU or on the GPU, same code); core/postprocess.py maps the detections back."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from yolov9.core.boxes import letterbox_params
from yolov9.core.image_io import MAX_PIXELS, ImageError, detections_to_json, image_size  # noqa: F401 (defined there)

PAD_VALUE = 114


@dataclass
class LetterboxMeta:
    orig_hw: tuple[int, int]
    ratio: float
    pad: tuple[float, float]  # left, top


def letterbox(
    img: torch.Tensor, size: int | tuple[int, int], stride: int = 32, auto: bool = False, scaleup: bool = True
):
    """uint8 (3, H, W) -> uint8 (3, S, S) (or the given (H, W)) resized with its aspect kept and padded with 114,
    plus the meta needed to map boxes back."""
    h, w = img.shape[-2:]
    r, (nh, nw), (pl, pt), (oh, ow) = letterbox_params(h, w, size, stride, auto, scaleup)
    img = resize_uint8(img[None], (nh, nw))[0]
    img = F.pad(img, (pl, ow - nw - pl, pt, oh - nh - pt), value=PAD_VALUE)
    return img, LetterboxMeta((h, w), r, (pl, pt))


def resize_uint8(batch: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> uint8 (B, 3, h, w), bilinear (no-op when the size already matches)."""
    if tuple(batch.shape[-2:]) == tuple(hw):
        return batch
    out = F.interpolate(batch.float(), size=hw, mode="bilinear", align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def to_input(batch_uint8: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 NCHW -> model input in [0, 1]; done on the device, so only bytes cross the bus."""
    return batch_uint8.to(dtype).div_(255)


def prepare_batch(
    images: list[torch.Tensor], size: int, device: str | torch.device = "cpu", rows: int = 0, kernel: bool = True
):
    """Letterbox a list of decoded images into one uint8 (B, 3, size, size) batch on `device`, as letterbox()
    would one by one; with rows > B the batch has that many, the last ones blank (padding up to a batch size the
    server has a CUDA graph for). On a CUDA device a batch of several images is one kernel
    (core/letterbox_kernel.py) unless `kernel` is False or it cannot run there; elsewhere images of one size share
    one resize call."""
    device = torch.device(device)
    if letterbox_path(len(images), device, kernel) == "kernel":
        from yolov9.core.letterbox_kernel import letterbox_batch

        out, placed = letterbox_batch([im.to(device) for im in images], size, rows, PAD_VALUE)
        return out, [LetterboxMeta(tuple(im.shape[-2:]), r, pad) for im, (r, pad) in zip(images, placed)]
    return _prepare_by_size(images, size, device, rows)


def _prepare_by_size(images: list[torch.Tensor], size: int, device: torch.device, rows: int):
    """The reference path: a serving batch of 64 photos has a handful of sizes, so this launches a few kernels per
    size instead of several per image."""
    out = torch.full((max(rows, len(images)), 3, size, size), PAD_VALUE, dtype=torch.uint8, device=device)
    metas: list = [None] * len(images)
    by_size: dict[tuple[int, int], list[int]] = {}
    for k, im in enumerate(images):
        by_size.setdefault(tuple(im.shape[-2:]), []).append(k)
    for (h, w), idx in by_size.items():
        r, (nh, nw), (pl, pt), _ = letterbox_params(h, w, size)
        if len(idx) == 1:  # alone in its size (most, in a batch of assorted photos): one copy, no index to send
            out[idx[0], :, pt : pt + nh, pl : pl + nw] = resize_uint8(images[idx[0]].to(device)[None], (nh, nw))[0]
        else:
            group = resize_uint8(torch.stack([images[k].to(device) for k in idx]), (nh, nw))
            out[torch.tensor(idx, device=device), :, pt : pt + nh, pl : pl + nw] = group
        for k in idx:
            metas[k] = LetterboxMeta((h, w), r, (pl, pt))
    return out, metas


def letterbox_path(n_images: int, device: torch.device, kernel: bool = True) -> str:
    """Which path letterboxes a batch of `n_images`: "kernel" or "by size". One image is a single resize, which the
    kernel's gather and tables make slower (docs/benchmarks.md, thirty-fourth session)."""
    use = kernel and n_images > 1 and device.type == "cuda" and letterbox_kernel_runs(device)
    return "kernel" if use else "by size"


@functools.cache
def letterbox_kernel_runs(device: torch.device) -> bool:
    """Whether the one-kernel letterbox compiles and runs on this GPU (Triton imports and finds its compiler); if
    not, the per-size path serves and the reason is printed once. False off CUDA devices."""
    if device.type != "cuda":
        return False
    try:
        from yolov9.core.letterbox_kernel import letterbox_batch

        letterbox_batch([torch.zeros(3, 2, 3, dtype=torch.uint8, device=device)], 32, 0, PAD_VALUE)
        return True
    except Exception as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"letterbox kernel unavailable on {device} ({reason}); letterboxing size by size", flush=True)
        return False
