"""Post-processing, once for the whole project: NMS over a batch of decoded predictions (nms_flat), the same with
boxes mapped back to original pixels (postprocess_flat), and the split into per-image tensors (per_image).
Validation, prediction, export checks and the server all go through these. The server first keeps the anchors over
each image's threshold in a buffer of fixed size (threshold_candidates: inside its CUDA graph, no host
synchronisation) and finishes on those (postprocess_candidates), which gives postprocess_flat's detections whenever
the buffer held them all."""

from __future__ import annotations

import torch

from yolov9.core.boxes import scale_boxes_back, xywh2xyxy
from yolov9.core.detection_defaults import CONF, IOU
from yolov9.core.preprocess import LetterboxMeta

Flat = tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]

# threshold_candidates writes the anchors past its buffer, and those under the threshold, to this many spare slots
# by anchor: hundreds of thousands of writes to one address would serialise
_SPILL = 1024

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
    per_conf = _one_per_image(conf, b, dev)
    allow = _allowed(classes, b, nc, dev)
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
    rows = _rows(xywh2xyxy(pred[img, :4, anchor]), s, c, img)
    if dev.type != "cpu" and len(rows) <= HOST_NMS_MAX:
        rows = rows.cpu()  # one device-to-host copy
    return _suppress(rows, b, nc, iou, max_det)


def _rows(boxes: torch.Tensor, s: torch.Tensor, c: torch.Tensor, img: torch.Tensor) -> torch.Tensor:
    """Candidates as one (N, 7) float32 tensor: x1, y1, x2, y2, score, class, image (the layout
    threshold_candidates writes; class and image are exact in float32 below 2**24)."""
    return torch.cat((boxes.float(), s.float()[:, None], c.float()[:, None], img.float()[:, None]), 1)


def _per_image(value: float | list[float], b: int) -> list[float]:
    """A list of per-image values as given, or one value for every image."""
    return list(value) if isinstance(value, (list, tuple)) else [value] * b


def _one_per_image(value: float | list[float], b: int, dev: torch.device) -> torch.Tensor:
    """(b,): `_per_image` on the device."""
    return torch.as_tensor(_per_image(value, b), device=dev)


def _allowed(classes, b: int, nc: int, dev: torch.device) -> torch.Tensor | None:
    """(B, nc) bool: the classes each image may report (None: all, for every image)."""
    if classes is None:
        return None
    per_image = [classes] * b if not classes or isinstance(classes[0], int) else classes
    allow = torch.ones(b, nc, dtype=torch.bool, device=dev)
    for i, c in enumerate(per_image):
        if c is not None:
            allow[i] = False
            allow[i, torch.as_tensor(c, dtype=torch.long, device=dev).clamp(0, nc - 1)] = True
    return allow


# torchvision's batched_nms runs one NMS over all candidates with each group's boxes offset apart while they are few,
# and one NMS per group past that, each group found by a pass over all candidates (b x nc passes at validation's conf
# 0.001). Past NMS_WHOLE_MAX candidates the groups here are sorted out once and packed, whole, into chunks of up to
# NMS_CHUNK candidates, each one offset NMS: one NMS per group costs a call each (on a GPU a wait for the host too),
# one over all the square of their number, and chunking its own few operations (on the CPU they cost more than the
# NMS up to torchvision's own limit, which covers the host NMS of a served image). Chosen by
# docs/scripts/nms_chunks.py (docs/benchmarks.md).
NMS_WHOLE_MAX = {"cpu": 1000, "cuda": 4000}
NMS_CHUNK = {"cpu": 100, "cuda": 4000}


def batched_nms(
    boxes: torch.Tensor, scores: torch.Tensor, key: torch.Tensor, iou: float, chunk: int | None = None
) -> torch.Tensor:
    """What torchvision's batched_nms keeps (the indices, in decreasing score; when chunked, equal scores by index),
    over chunks of whole groups of at most `chunk` candidates past NMS_WHOLE_MAX (a given `chunk` is both). A
    chunk's groups are offset by their rank within it, which keeps the offset coordinates small."""
    import torchvision  # imported at first use, off the trainer's start (core/decode.decode_image)

    dev = boxes.device.type if boxes.device.type in NMS_CHUNK else "cuda"
    whole, chunk = (NMS_WHOLE_MAX[dev], NMS_CHUNK[dev]) if chunk is None else (chunk, chunk)
    if len(boxes) <= whole:
        return torchvision.ops.batched_nms(boxes, scores, key, iou)
    key_sorted, perm = torch.sort(key, stable=True)
    _, group, counts = torch.unique_consecutive(key_sorted, return_inverse=True, return_counts=True)
    boxes, group_scores = boxes[perm], scores[perm]
    kept = []
    for a, b, groups in _chunks(counts.tolist(), chunk):
        if groups == 1:  # no offsets to add
            kept.append(torchvision.ops.nms(boxes[a:b], group_scores[a:b], iou) + a)
        else:
            kept.append(torchvision.ops.batched_nms(boxes[a:b], group_scores[a:b], group[a:b] - group[a], iou) + a)
    mask = torch.zeros_like(key, dtype=torch.bool)
    mask[perm[torch.cat(kept)]] = True
    keep = mask.nonzero().view(-1)
    return keep[scores[keep].sort(descending=True, stable=True)[1]]


def _chunks(counts: list[int], limit: int) -> list[tuple[int, int, int]]:
    """(start, end, groups) of consecutive runs of groups (`counts` candidates each) of at most `limit` candidates;
    a group larger than that is a run of its own."""
    runs, start, end, groups = [], 0, 0, 0
    for n in counts:
        if groups and end - start + n > limit:
            runs.append((start, end, groups))
            start, groups = end, 0
        end += n
        groups += 1
    runs.append((start, end, groups))
    return runs


def _suppress(rows: torch.Tensor, b: int, nc: int, iou: float, max_det: int | list[int]) -> Flat:
    """NMS per (image, class) over candidate rows (N, 7: x1, y1, x2, y2, score, class, image) of b images, then at
    most max_det per image, grouped by image in score order. Few tensor operations: at a light load this runs once
    per request on the host, where each operation costs microseconds whatever its size."""
    key = (rows[:, 6] * nc + rows[:, 5]).long()  # one NMS group per (image, class)
    keep = batched_nms(rows[:, :4], rows[:, 4], key, iou)  # sorted by score
    dev = rows.device
    if b == 1:  # one image (light load): already grouped and ranked, so the grouping below would change nothing
        keep = keep[: _per_image(max_det, 1)[0]]
        return rows[keep, :6], torch.zeros_like(keep), torch.arange(len(keep), device=dev), [len(keep)]
    per_max = _one_per_image(max_det, b, dev)
    owner = rows[keep, 6].long()
    order = torch.sort(owner, stable=True).indices  # group by image, score order kept within each
    keep, owner = keep[order], owner[order]
    counts = torch.bincount(owner, minlength=b)
    rank = torch.arange(len(owner), device=dev) - (counts.cumsum(0) - counts)[owner]
    sel = (rank < per_max[owner]).nonzero().squeeze(1)
    return rows[keep[sel], :6], owner[sel], rank[sel], torch.minimum(counts, per_max).tolist()


def threshold_candidates(pred: torch.Tensor, conf: torch.Tensor, k: int) -> torch.Tensor:
    """(k + 1, 7) float32 from decoded (B, 4 + nc, A) predictions and each image's threshold (B,): rows x1, y1, x2,
    y2, score, class, image of the first k anchors whose best-class score is over their image's threshold (image by
    image, in anchor order, as nms_flat takes them), then a row whose values are how many there were in all (also
    past k; the rows past that count are filler). Fixed shapes and no host synchronisation, so it is captured in the
    same CUDA graph as the engine; postprocess_candidates finishes on its first rows."""
    pred = main_head(pred)
    scores, cls = pred[:, 4:].max(1)  # (B, A)
    over = (scores > conf[:, None]).flatten()
    slot = over.cumsum(0)  # 1-based place of each candidate among them
    flat = torch.arange(len(over), device=pred.device)
    dest = torch.where(over & (slot <= k), slot - 1, k + flat % _SPILL)
    idx = torch.zeros(k + _SPILL, dtype=torch.long, device=pred.device).scatter_(0, dest, flat)[:k]
    img, anchor = idx // pred.shape[2], idx % pred.shape[2]
    rows = _rows(xywh2xyxy(pred[img, :4, anchor]), scores.flatten()[idx], cls.flatten()[idx], img)
    return torch.cat((rows, slot[-1:].float()[:, None].expand(1, 7)))


def postprocess_candidates(
    cand: torch.Tensor,
    metas: list[LetterboxMeta],
    nc: int,
    iou: float = IOU,
    max_det: int | list[int] = 300,
    classes: list[int] | list[list[int] | None] | None = None,
    gpu: torch.device | None = None,
) -> Flat:
    """postprocess_flat() (single label) from every candidate over its image's threshold as threshold_candidates
    gives them (N, 7), the image column indexing `metas`; NMS runs on their device, or on `gpu` past HOST_NMS_MAX
    candidates on the CPU."""
    allow = _allowed(classes, len(metas), nc, cand.device)
    if allow is not None:
        cand = cand[allow[cand[:, 6].long(), cand[:, 5].long()]]
    if gpu is not None and cand.device.type == "cpu" and len(cand) > HOST_NMS_MAX:
        cand = cand.to(gpu)
    return _to_original(_suppress(cand, len(metas), nc, iou, max_det), metas)


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
    return _to_original(nms_flat(pred, conf, iou, max_det, classes, multi_label=multi_label), metas)


def _to_original(flat: Flat, metas: list[LetterboxMeta]) -> Flat:
    det, owner, rank, counts = flat
    # ratio, pad left/top, orig h/w per image on the detections' device, then (past one image) one row per detection
    per_image = torch.tensor([[m.ratio, *m.pad, *m.orig_hw] for m in metas], device=det.device, dtype=det.dtype)
    per_det = per_image if len(metas) == 1 else per_image[owner]
    det[:, :4] = scale_boxes_back(det[:, :4], per_det[:, 0], per_det[:, 1:3], per_det[:, 3:5])
    return det, owner, rank, counts
