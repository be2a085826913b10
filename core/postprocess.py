"""Post-processing, once for the whole project: NMS over a batch of decoded predictions (nms_flat), the same with
boxes mapped back to original pixels (postprocess_flat), and the split into per-image tensors (per_image).
Validation, prediction, export checks and the server all go through these."""

from __future__ import annotations

import torch
import torchvision

from yolov9.core.boxes import scale_boxes_back, xywh2xyxy
from yolov9.core.detection_defaults import CONF, IOU
from yolov9.core.preprocess import LetterboxMeta

Flat = tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]

# Up to this many candidates, NMS on the host beats the GPU's: torchvision's CPU NMS takes about 0.1 ms for 256
# boxes (it grows with the square, and past 1,000 boxes it loops per class), where the GPU path is about ten small
# kernels and several synchronisations. Light load (a batch of a few images) is where this pays.
HOST_NMS_MAX = 256


def per_image(flat: Flat) -> list[torch.Tensor]:
    """A flat result as one (n, 6) tensor per image: x1, y1, x2, y2, score, class."""
    det, _, _, counts = flat
    return list(det.split(counts))


def _top_per_image(img, anchor, s, c, b: int, k: int):
    """At most k candidates per image, the highest scores (the official per-image cap before NMS)."""
    counts = torch.bincount(img, minlength=b)
    if counts.numel() == 0 or int(counts.max()) <= k:
        return img, anchor, s, c
    order = torch.argsort(img.double() * 2 - s.double())  # by image, then by descending score (s <= 1)
    img, anchor, s, c = img[order], anchor[order], s[order], c[order]
    rank = torch.arange(len(img), device=img.device) - (counts.cumsum(0) - counts)[img]
    keep = rank < k
    return img[keep], anchor[keep], s[keep], c[keep]


def _to_host(boxes: torch.Tensor, s: torch.Tensor, c: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Candidates on the CPU in one device-to-host copy: boxes and scores in float32, classes and images as long
    (exact in float32 below 2**24)."""
    rows = torch.cat((boxes.float(), s.float()[:, None], c.float()[:, None], img.float()[:, None]), 1).cpu()
    return rows[:, :4], rows[:, 4], rows[:, 5].long(), rows[:, 6].long()


def main_head(pred: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """The decoded output of a model in eval mode; a dual-head (YOLOv9) model gives [auxiliary, main]."""
    return pred[-1] if isinstance(pred, (list, tuple)) else pred


def nms_flat(
    pred: torch.Tensor,
    conf: float | list[float] = CONF,
    iou: float = IOU,
    max_det: int | list[int] = 300,
    classes: list[int] | list[list[int] | None] | None = None,
    max_nms: int = 30000,
    multi_label: bool = False,
) -> Flat:
    """Detections (N, 6) = x1, y1, x2, y2, score, class from decoded (B, 4 + nc, A) predictions, for the whole
    batch at once, grouped by image (score order within each), with the image of each row (N,), its rank within
    that image (N,) and the rows per image. Two host synchronisations per batch besides the NMS kernel's own.
    On a GPU, at most HOST_NMS_MAX candidates over the threshold go to the host in one copy and the NMS runs there
    (the result is then on the CPU, in float32); more stay on the GPU.

    Each anchor contributes its best class (the deployment convention), or with multi_label every class above conf
    (the official validation protocol, at most max_nms candidates per image); one torchvision batched NMS call
    suppresses per (image, class). conf, max_det and classes may be given per image (the server batches requests
    with different parameters)."""
    pred = main_head(pred)
    b, nc = pred.shape[0], pred.shape[1] - 4
    dev = pred.device
    per_conf = torch.as_tensor(conf if isinstance(conf, (list, tuple)) else [conf] * b, device=dev)
    allow = None
    if classes is not None:
        per_image = [classes] * b if not classes or isinstance(classes[0], int) else classes
        allow = torch.ones(b, nc, dtype=torch.bool, device=dev)
        for i, c in enumerate(per_image):
            if c is not None:
                allow[i] = False
                allow[i, torch.as_tensor(c, dtype=torch.long, device=dev).clamp(0, nc - 1)] = True
    if multi_label:  # every class above the threshold is a candidate (the official validation protocol)
        scores = pred[:, 4:] if allow is None else pred[:, 4:] * allow[:, :, None]
        img, c, anchor = (scores > per_conf[:, None, None]).nonzero(as_tuple=True)
        s = scores[img, c, anchor]
        img, anchor, s, c = _top_per_image(img, anchor, s, c, b, max_nms)
    else:  # each anchor's best class only (deployment)
        scores, cls = pred[:, 4:].max(1)  # (B, A)
        if allow is not None:
            scores = torch.where(allow.gather(1, cls), scores, torch.zeros_like(scores))
        img, anchor = (scores > per_conf[:, None]).nonzero(as_tuple=True)
        s, c = scores[img, anchor], cls[img, anchor]
        if s.numel() > max_nms * b:
            top = s.topk(max_nms * b).indices
            img, anchor, s, c = img[top], anchor[top], s[top], c[top]
    boxes = xywh2xyxy(pred[img, :4, anchor])
    if dev.type != "cpu" and len(s) <= HOST_NMS_MAX:
        boxes, s, c, img = _to_host(boxes, s, c, img)
        dev = boxes.device
    per_max = torch.as_tensor(max_det if isinstance(max_det, (list, tuple)) else [max_det] * b, device=dev)
    keep = torchvision.ops.batched_nms(boxes.float(), s.float(), img * nc + c, iou)  # sorted by score
    owner = img[keep]
    order = torch.sort(owner, stable=True).indices  # group by image, score order kept within each
    keep, owner = keep[order], owner[order]
    counts = torch.bincount(owner, minlength=b)
    rank = torch.arange(len(owner), device=dev) - (counts.cumsum(0) - counts)[owner]
    sel = (rank < per_max[owner]).nonzero().squeeze(1)
    keep, owner, rank = keep[sel], owner[sel], rank[sel]
    det = torch.cat((boxes[keep], s[keep, None], c[keep, None].to(boxes.dtype)), 1)
    return det, owner, rank, torch.minimum(counts, per_max).tolist()


def postprocess_flat(
    pred: torch.Tensor,
    metas: list[LetterboxMeta],
    conf: float | list[float] = CONF,
    iou: float = IOU,
    max_det: int | list[int] = 300,
    classes: list[int] | list[list[int] | None] | None = None,
    multi_label: bool = False,
) -> Flat:
    """nms_flat() with the boxes mapped back to original-image pixels through each image's letterbox meta, for the
    whole batch at once: detections (N, 6) grouped by image, the image of each row, its rank within that image
    and the rows per image."""
    det, owner, rank, counts = nms_flat(pred, conf, iou, max_det, classes, multi_label=multi_label)
    # ratio, pad left/top, orig h/w per image on the detections' device, then one row per detection
    per_image = torch.tensor([[m.ratio, *m.pad, *m.orig_hw] for m in metas], device=det.device, dtype=det.dtype)
    per_det = per_image.reshape(-1, 5)[owner]
    boxes = scale_boxes_back(det[:, :4], per_det[:, 0], per_det[:, 1:3], per_det[:, 3:5])
    return torch.cat((boxes, det[:, 4:]), 1), owner, rank, counts
