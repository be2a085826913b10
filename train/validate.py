"""Validation: COCO-standard mAP50-95 / mAP50 with pycocotools, precision and recall at the confidence of best
mean F1, a per-class table, and (for a model in training) the validation losses, the precision/recall/F1 curves,
a confusion matrix and one batch of predictions for the run folder's plots. Works with any callable that maps a
float batch to decoded predictions (a model, or any engine of export/engine.py), in a named protocol."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils._pytree import tree_map
from tqdm import tqdm

from yolov9.core.boxes import xywh2xyxy
from yolov9.core.device import synchronized_time
from yolov9.core.errors import BadInput
from yolov9.core.modules import raw_outputs
from yolov9.core.postprocess import main_head, per_image, postprocess_flat
from yolov9.train import scoring
from yolov9.train.data.dataset import Batch, DetectionDataset
from yolov9.train.metrics import confusion_matrix, pr_curves
from yolov9.train.stall import watched
from yolov9.train.step import autocast


@dataclass(frozen=True)
class Protocol:
    """How predictions are made and scored: batching, NMS and its thresholds."""

    rect: bool = True  # rectangular batches (stride-aligned shapes per batch of sorted aspect ratios, pad 0.5)
    multi_label: bool = True  # every class above conf per box, not only the best one
    conf: float = 0.001
    iou: float = 0.7
    max_det: int = 300

    @property
    def name(self) -> str:
        kind = "official" if self.rect and self.multi_label else "deployment" if not self.rect else "mixed"
        parts = ["rectangular batches" if self.rect else "square letterbox of the original image"]
        parts.append("multi-label NMS" if self.multi_label else "one label per box")
        return f"{kind} protocol ({', '.join(parts)}; conf {self.conf:g}, IoU {self.iou:g}, at most {self.max_det})"


OFFICIAL = Protocol()
DEPLOYMENT = Protocol(rect=False, multi_label=False)


def class_index(model_names: list[str], data_names: list[str]) -> list[int] | None:
    """For each of the data's classes the model's output index of the same name; None when the lists are equal.
    A data class the model does not have is an error: its boxes could never be found, and scores would mislead."""
    if list(model_names) == list(data_names):
        return None
    where = {n: i for i, n in enumerate(model_names)}
    missing = [n for n in data_names if n not in where]
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise BadInput(
            f"the data's classes {shown} are not among the model's {len(model_names)} classes ({len(missing)} of "
            f"{len(data_names)} missing): validate on data labelled with the model's classes"
        )
    return [where[n] for n in data_names]


class ClassMapped:
    """An engine whose class outputs are re-ordered (and cut) to a dataset's class list, matched by name."""

    def __init__(self, engine, index: list[int]):
        self.engine, self.index = engine, index
        self.device, self.dtype = _device_dtype(engine)

    def __getattr__(self, name: str):  # kind, img_size, ... of the engine
        return getattr(self.engine, name)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        pred = main_head(self.engine(x))
        cols = torch.tensor([0, 1, 2, 3, *(4 + i for i in self.index)], device=pred.device)
        return pred.index_select(1, cols)


def ground_truth(ds: DetectionDataset, shapes: dict[int, tuple[int, int]]) -> tuple[list[dict], list[dict]]:
    """The dataset's images and labels as COCO image and annotation records, in the pixel frame of each loaded
    image."""
    images, anns = [], []
    for i, (h, w) in shapes.items():
        images.append({"id": i, "height": h, "width": w})
        for c, x, y, bw, bh in ds.labels[i].tolist():
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": i,
                    "category_id": int(c),
                    "iscrowd": 0,
                    "bbox": [(x - bw / 2) * w, (y - bh / 2) * h, bw * w, bh * h],
                    "area": bw * w * bh * h,
                }
            )
    return images, anns


def letterboxed_targets(batch: Batch, hw: tuple[int, int]) -> torch.Tensor:
    """The batch's target rows (normalised to each original image) normalised to the letterboxed input of size hw:
    what the loss takes."""
    rows = batch.rows.clone()
    if len(rows):
        meta = torch.tensor([[*m.orig_hw, m.ratio, *m.pad] for m in batch.metas], dtype=rows.dtype)[rows[:, 0].long()]
        (h0, w0, r, left, top), (h, w) = meta.unbind(1), hw
        rows[:, 2] = (rows[:, 2] * w0 * r + left) / w
        rows[:, 3] = (rows[:, 3] * h0 * r + top) / h
        rows[:, 4] = rows[:, 4] * w0 * r / w
        rows[:, 5] = rows[:, 5] * h0 * r / h
    return rows


def _device_dtype(predict) -> tuple[torch.device, torch.dtype]:
    if isinstance(predict, torch.nn.Module):
        p = next(predict.parameters())
        return p.device, p.dtype
    return torch.device(predict.device), predict.dtype


@torch.no_grad()
def evaluate(
    predict: Callable[[torch.Tensor], torch.Tensor],
    loader,
    protocol: Protocol = DEPLOYMENT,
    progress: bool = True,
    loss_fn: Callable | None = None,
    plots: bool = False,
    amp: torch.dtype | None = None,
) -> dict:
    """Runs `predict` over the loader (built on a non-augmenting DetectionDataset) and scores it; the result also
    holds images/s of the whole pass (decode, engine, NMS). With `loss_fn` (predict is then a model) it adds the
    validation loss items, and `amp` runs the model's layers under that autocast dtype (the loss, the decode and NMS
    stay fp32); with `plots`, the curves, confusion matrix and first batch under 'plots'."""
    ds: DetectionDataset = loader.dataset
    device, dtype = _device_dtype(predict)
    dets, shapes, per_image_dets, losses, sample, nms_s = [], {}, {}, [], None, 0.0
    t0 = time.perf_counter()
    for batch in watched(tqdm(loader, desc="val", leave=False, disable=not progress)):
        x = batch.images.to(device, non_blocking=True).to(dtype) / 255
        if loss_fn is not None:  # the head's raw maps give the loss, and decode to what eval mode returns
            with raw_outputs(predict), autocast(device.type, amp):
                raw = tree_map(lambda t: t.float(), predict(x))
            losses.append(loss_fn(raw, letterboxed_targets(batch, x.shape[2:]).to(device))[1])
            pred = (predict.head if hasattr(predict, "head") else predict).decode_all(raw)
        else:
            pred = predict(x)
        p = protocol
        t_nms = synchronized_time(device)  # the forward's kernels done: what follows is NMS and the copy back
        flat = postprocess_flat(
            main_head(pred).float(), batch.metas, p.conf, p.iou, p.max_det, multi_label=p.multi_label
        )
        found = [d.cpu() for d in per_image(flat)]  # each copy waits for NMS's kernels
        nms_s += time.perf_counter() - t_nms
        if plots and sample is None:
            sample = (batch, found)
        for det, i, meta in zip(found, batch.indices.tolist(), batch.metas):
            shapes[i], per_image_dets[i] = meta.orig_hw, det
            for x1, y1, x2, y2, s, c in det.tolist():
                dets.append([i, x1, y1, x2 - x1, y2 - y1, s, int(c)])
    seconds = time.perf_counter() - t0
    res, curves = score(ds, shapes, dets)
    res["images_per_s"] = len(shapes) / max(seconds, 1e-9)
    # what scoring costs beside the pass: it grows with the detections (up to max_det per image early in training)
    res.update(detections=len(dets), score_s=time.perf_counter() - t0 - seconds, nms_s=nms_s)
    if losses:
        res.update(zip(("val_box", "val_cls", "val_dfl"), torch.stack(losses).mean(0).tolist()))
    if plots:
        gts = [_pixel_labels(ds, i, shapes[i]) for i in per_image_dets]
        res["plots"] = {
            "curves": curves,
            "confusion": confusion_matrix(list(per_image_dets.values()), gts, len(ds.names)),
            "sample": sample,
        }
    return res


def _pixel_labels(ds: DetectionDataset, i: int, hw: tuple[int, int]) -> torch.Tensor:
    """Image i's labels as (n, 5) class, x1, y1, x2, y2 in its original pixels."""
    lab = torch.from_numpy(ds.labels[i].copy())
    h, w = hw
    return torch.cat((lab[:, :1], xywh2xyxy(lab[:, 1:] * torch.tensor([w, h, w, h]))), 1)


def score(ds: DetectionDataset, shapes: dict, dets: list[list[float]]) -> tuple[dict, dict | None]:
    """mAP50-95, mAP50, P and R at the best-F1 confidence, and per class the same, from pycocotools (split by class
    over processes when there are many detections, train/scoring.py); and the curves of metrics.pr_curves (None
    when there is nothing to score)."""
    images, anns = ground_truth(ds, shapes)
    result = {"map": 0.0, "map50": 0.0, "precision": 0.0, "recall": 0.0, "per_class": {}}
    result.update(images=len(shapes), instances=len(anns))
    if not dets or not anns:  # nothing found (or nothing to find): every class with instances scores zero
        counts = np.bincount([a["category_id"] for a in anns], minlength=len(ds.names))
        result["per_class"] = {
            ds.names[k]: {"instances": int(n), "p": 0.0, "r": 0.0, "ap50": 0.0, "ap": 0.0}
            for k, n in enumerate(counts)
            if n
        }
        return result, None
    classes = list(range(len(ds.names)))
    scores = scoring.evaluate(images, anns, np.asarray(dets, dtype=np.float64), sorted(shapes), classes)
    curves = pr_curves(scores)
    prec = scores["precision"]  # (IoU thresholds, recall points, classes); -1 where a class has no truth
    result.update(map=_mean_ap(prec), map50=_mean_ap(prec[:1]))
    result.update(precision=curves["mean_p"], recall=curves["mean_r"])
    for k in classes:
        p, p50 = prec[:, :, k], prec[0, :, k]
        if curves["instances"][k]:
            result["per_class"][ds.names[k]] = {
                "instances": int(curves["instances"][k]),
                "p": float(curves["p_at_best"][k]),
                "r": float(curves["r_at_best"][k]),
                "ap50": float(p50[p50 > -1].mean()) if (p50 > -1).any() else 0.0,
                "ap": float(p[p > -1].mean()) if (p > -1).any() else 0.0,
            }
    return result, curves


def _mean_ap(prec: np.ndarray) -> float:
    """COCOeval.summarize's average precision: the mean over the entries that have ground truth."""
    valid = prec[prec > -1]
    return float(valid.mean()) if valid.size else 0.0


def format_table(res: dict) -> str:
    """The per-class table (as Ultralytics prints it): images, instances, P, R, mAP50, mAP50-95."""
    head = f"{'class':<20}{'images':>8}{'instances':>11}{'P':>8}{'R':>8}{'mAP50':>8}{'mAP50-95':>10}"
    rows = [head, f"{'all':<20}{res['images']:>8}{res['instances']:>11}{res['precision']:>8.3f}"
            f"{res['recall']:>8.3f}{res['map50']:>8.3f}{res['map']:>10.3f}"]  # fmt: skip
    for name, r in sorted(res["per_class"].items(), key=lambda kv: -kv[1]["instances"]):
        rows.append(
            f"{name:<20}{'':>8}{r['instances']:>11}{r['p']:>8.3f}{r['r']:>8.3f}{r['ap50']:>8.3f}{r['ap']:>10.3f}"
        )
    return "\n".join(rows)
