"""Box geometry shared by the head, the loss, validation, export and serving: anchors, decoding, IoU, NMS and
the mapping between letterboxed and original image coordinates."""

from __future__ import annotations

import math

import torch


def make_anchors(feats: list[torch.Tensor], strides: torch.Tensor, offset: float = 0.5, dtype=None):
    """Cell centres (A, 2) in grid units and the stride of each anchor (A, 1), level by level."""
    points, stride_t = [], []
    dtype, device = dtype or feats[0].dtype, feats[0].device
    for f, s in zip(feats, strides):
        h, w = f.shape[-2:]
        sx = torch.arange(w, device=device, dtype=dtype) + offset
        sy = torch.arange(h, device=device, dtype=dtype) + offset
        yy, xx = torch.meshgrid(sy, sx, indexing="ij")
        points.append(torch.stack((xx, yy), -1).view(-1, 2))
        stride_t.append(torch.ones(h * w, 1, dtype=dtype, device=device) * s.to(dtype))
    return torch.cat(points), torch.cat(stride_t)


def dist2bbox(distance: torch.Tensor, anchors: torch.Tensor, xywh: bool = True, dim: int = -1) -> torch.Tensor:
    """(left, top, right, bottom) distances from anchor points to boxes (xywh or xyxy)."""
    lt, rb = distance.split(2, dim)
    x1y1, x2y2 = anchors - lt, anchors + rb
    if xywh:
        return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), dim)
    return torch.cat((x1y1, x2y2), dim)


def bbox2dist(anchors: torch.Tensor, bbox: torch.Tensor, reg_max: float) -> torch.Tensor:
    x1y1, x2y2 = bbox.split(2, -1)
    return torch.cat((anchors - x1y1, x2y2 - anchors), -1).clamp(0, reg_max - 0.01)


def xywh2xyxy(x: torch.Tensor) -> torch.Tensor:
    """Centre-size boxes (..., 4) as corners. Plain arithmetic rather than torchvision's box_convert: the model and
    the loss need nothing else of torchvision, whose import (with the torch._dynamo it pulls in) would otherwise
    sit before every training run's first step."""
    xy, wh = x[..., :2], x[..., 2:]
    return torch.cat((xy - wh / 2, xy + wh / 2), -1)


def bbox_ciou(box1: torch.Tensor, box2: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """Complete IoU of xyxy boxes, broadcasting over leading dims; result keeps a trailing dim of 1.

    The arithmetic (eps on heights only, alpha without gradient) follows the official code exactly, since the
    loss must reproduce the official values to 1e-4."""
    b1_x1, b1_y1, b1_x2, b1_y2 = box1.chunk(4, -1)
    b2_x1, b2_y1, b2_x2, b2_y2 = box2.chunk(4, -1)
    w1, h1 = b1_x2 - b1_x1, b1_y2 - b1_y1 + eps
    w2, h2 = b2_x2 - b2_x1, b2_y2 - b2_y1 + eps
    inter = (torch.min(b1_x2, b2_x2) - torch.max(b1_x1, b2_x1)).clamp(0) * (
        torch.min(b1_y2, b2_y2) - torch.max(b1_y1, b2_y1)
    ).clamp(0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union
    cw = torch.max(b1_x2, b2_x2) - torch.min(b1_x1, b2_x1)
    ch = torch.max(b1_y2, b2_y2) - torch.min(b1_y1, b2_y1)
    c2 = cw**2 + ch**2 + eps
    rho2 = ((b2_x1 + b2_x2 - b1_x1 - b1_x2) ** 2 + (b2_y1 + b2_y2 - b1_y1 - b1_y2) ** 2) / 4
    v = (4 / math.pi**2) * torch.pow(torch.atan(w2 / h2) - torch.atan(w1 / h1), 2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (rho2 / c2 + v * alpha)


def letterbox_params(
    h: int, w: int, size: int | tuple[int, int], stride: int = 32, auto: bool = False, scaleup: bool = True
):
    """Scale, resized size, integer (left, top) padding and output size that fit an h x w image into size x size,
    an (H, W) shape (a rectangular validation batch), or a stride multiple if auto. scaleup=False only shrinks."""
    th, tw = (size, size) if isinstance(size, int) else size
    r = min(th / h, tw / w)
    r = r if scaleup else min(r, 1.0)
    nh, nw = max(round(h * r), 1), max(round(w * r), 1)  # a sliver (4000 x 1) keeps one row, not none
    out_h, out_w = (math.ceil(nh / stride) * stride, math.ceil(nw / stride) * stride) if auto else (th, tw)
    return r, (nh, nw), ((out_w - nw) // 2, (out_h - nh) // 2), (out_h, out_w)


def scale_boxes_back(boxes: torch.Tensor, ratio, pad, orig_hw) -> torch.Tensor:
    """Map xyxy boxes from letterboxed pixels to original-image pixels, clipped to the image. ratio, pad (left,
    top) and orig_hw (h, w) are one image's values, or per-box tensors (N,), (N, 2), (N, 2) for a whole batch."""
    t = dict(dtype=boxes.dtype, device=boxes.device)
    pad, hw, r = (torch.as_tensor(v, **t) for v in (pad, orig_hw, ratio))
    corners = boxes[..., :4].unflatten(-1, (2, 2))  # (..., corner, xy): both corners broadcast against one pad
    out = ((corners - pad[..., None, :]) / r[..., None, None]).clamp(min=0)
    return torch.minimum(out, hw.flip(-1)[..., None, :]).flatten(-2)
