"""The whole batch's letterbox in one GPU kernel (Triton): every image of any size resized, padded and written
into the uint8 batch at once. prepare_batch (core/preprocess.py) uses it on CUDA devices; the per-size torch path
there stays the reference, and this kernel follows its arithmetic (PyTorch's bilinear `upsample_bilinear2d`,
align_corners=False, then round half to even), so the two agree to within one grey level."""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from yolov9.core.boxes import letterbox_params

BLOCK = 1024
_INT_FIELDS = 7  # per image: offset into the flat sources, h, w, resized h, resized w, left and top padding


@triton.jit
def _letterbox(src, ints, scales, out, S, PAD: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_grid = p < S * S
    y, x = p // S, p % S
    row = ints + b * 7  # _INT_FIELDS
    off, h, w = tl.load(row), tl.load(row + 1), tl.load(row + 2)
    nh, nw, pl, pt = tl.load(row + 3), tl.load(row + 4), tl.load(row + 5), tl.load(row + 6)
    sh, sw = tl.load(scales + b * 2), tl.load(scales + b * 2 + 1)
    ry, rx = y - pt, x - pl
    inside = in_grid & (ry >= 0) & (ry < nh) & (rx >= 0) & (rx < nw)
    # source coordinates as upsample_bilinear2d computes them: scale * (dst + 0.5) - 0.5, clamped at 0
    fy = tl.maximum(sh * (ry.to(tl.float32) + 0.5) - 0.5, 0.0)
    fx = tl.maximum(sw * (rx.to(tl.float32) + 0.5) - 0.5, 0.0)
    y0, x0 = fy.to(tl.int64), fx.to(tl.int64)
    y1 = y0 + (y0 < h - 1).to(tl.int64)
    x1 = x0 + (x0 < w - 1).to(tl.int64)
    ly, lx = fy - y0.to(tl.float32), fx - x0.to(tl.float32)
    for c in tl.static_range(3):
        plane = src + off + c * h * w
        v00 = tl.load(plane + y0 * w + x0, mask=inside, other=0).to(tl.float32)
        v01 = tl.load(plane + y0 * w + x1, mask=inside, other=0).to(tl.float32)
        v10 = tl.load(plane + y1 * w + x0, mask=inside, other=0).to(tl.float32)
        v11 = tl.load(plane + y1 * w + x1, mask=inside, other=0).to(tl.float32)
        v = (1.0 - ly) * ((1.0 - lx) * v00 + lx * v01) + ly * ((1.0 - lx) * v10 + lx * v11)
        r = tl.floor(v + 0.5)
        r = tl.where(((r - v) == 0.5) & ((r.to(tl.int32) & 1) == 1), r - 1.0, r)  # half to even, as torch.round
        r = tl.where(inside, r, PAD)
        tl.store(out + b * 3 * S * S + c * S * S + p, r.to(tl.uint8), mask=in_grid)


def letterbox_batch(
    images: list[torch.Tensor], size: int, rows: int, pad_value: int
) -> tuple[torch.Tensor, list[tuple]]:
    """uint8 (3, H, W) images on one device -> the uint8 (max(rows, B), 3, size, size) batch, plus each image's
    (ratio, (left, top)) padding; rows past B are blank (pad_value). One copy gathers the images, one kernel
    writes the batch."""
    device = images[0].device
    out = torch.empty((max(rows, len(images)), 3, size, size), dtype=torch.uint8, device=device)
    out[len(images) :].fill_(pad_value)
    ints = np.zeros((len(images), _INT_FIELDS), np.int64)
    scales = np.zeros((len(images), 2), np.float32)
    placed, offset = [], 0
    for k, im in enumerate(images):
        h, w = im.shape[-2:]
        r, (nh, nw), (pl, pt), _ = letterbox_params(h, w, size)
        ints[k] = (offset, h, w, nh, nw, pl, pt)
        scales[k] = (np.float32(h) / np.float32(nh), np.float32(w) / np.float32(nw))  # float32, as the CUDA op
        placed.append((r, (pl, pt)))
        offset += im.numel()
    src = torch.cat([im.reshape(-1) for im in images]) if len(images) > 1 else images[0].reshape(-1)
    meta_i = torch.from_numpy(ints).to(device)
    meta_f = torch.from_numpy(scales).to(device)
    grid = (len(images), triton.cdiv(size * size, BLOCK))
    _letterbox[grid](src, meta_i, meta_f, out, size, PAD=pad_value, BLOCK=BLOCK)
    return out, placed
