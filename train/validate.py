"""Validation: COCO-standard mAP50-95 / mAP50 with pycocotools, and a per-class AP table. Works with any
callable that maps a float batch to decoded predictions (a model, or any engine of export/engine.py)."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable

import numpy as np
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from tqdm import tqdm

from core.postprocess import main_head, per_image, postprocess_flat
from train.data.dataset import DetectionDataset


def coco_ground_truth(ds: DetectionDataset, shapes: dict[int, tuple[int, int]]) -> COCO:
    """The dataset's labels as an in-memory COCO object, in the pixel frame of each loaded image."""
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
    gt = COCO()
    gt.dataset = {
        "images": images,
        "annotations": anns,
        "categories": [{"id": k, "name": n} for k, n in enumerate(ds.names)],
    }
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    return gt


@torch.no_grad()
def evaluate(
    predict: Callable[[torch.Tensor], torch.Tensor],
    loader,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    conf: float = 0.001,
    iou: float = 0.7,
    max_det: int = 300,
    progress: bool = True,
    multi_label: bool = False,
) -> dict:
    """Runs `predict` over the loader (built on a non-augmenting DetectionDataset) and scores it; the result also
    holds images/s of the whole pass (decode, engine, NMS)."""
    ds: DetectionDataset = loader.dataset
    dets, shapes = [], {}
    t0 = time.perf_counter()
    for imgs, _, _, idx, metas in tqdm(loader, desc="val", leave=False, disable=not progress):
        x = imgs.to(device, non_blocking=True).to(dtype) / 255
        # the loader carries each image's letterbox meta
        flat = postprocess_flat(main_head(predict(x)).float(), metas, conf, iou, max_det, multi_label=multi_label)
        for det, i, meta in zip(per_image(flat), idx.tolist(), metas):
            shapes[i] = meta.orig_hw
            for x1, y1, x2, y2, s, c in det.cpu().tolist():
                dets.append([i, x1, y1, x2 - x1, y2 - y1, s, int(c)])
    seconds = time.perf_counter() - t0
    return {**score(ds, shapes, dets), "images_per_s": len(shapes) / max(seconds, 1e-9)}


def score(ds: DetectionDataset, shapes: dict, dets: list[list[float]]) -> dict:
    gt = coco_ground_truth(ds, shapes)
    n_gt = len(gt.dataset["annotations"])
    result = {"map": 0.0, "map50": 0.0, "per_class": {}, "images": len(shapes), "instances": n_gt}
    if not dets or not n_gt:
        return result
    with contextlib.redirect_stdout(io.StringIO()):
        pred = gt.loadRes(np.array(dets, dtype=np.float64))
        ev = COCOeval(gt, pred, "bbox")
        ev.params.imgIds = sorted(shapes)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    result["map"], result["map50"] = float(ev.stats[0]), float(ev.stats[1])
    prec = ev.eval["precision"]  # (iou thresholds, recall, classes, areas, max dets)
    for k, cat in enumerate(ev.params.catIds):
        p = prec[:, :, k, 0, -1]
        p50 = prec[0, :, k, 0, -1]
        n = sum(1 for a in gt.dataset["annotations"] if a["category_id"] == cat)
        if n:
            result["per_class"][ds.names[cat]] = {
                "instances": n,
                "ap": float(p[p > -1].mean()) if (p > -1).any() else 0.0,
                "ap50": float(p50[p50 > -1].mean()) if (p50 > -1).any() else 0.0,
            }
    return result


def format_table(res: dict) -> str:
    rows = [
        f"{'class':<20}{'instances':>10}{'AP50':>8}{'AP50-95':>9}",
        f"{'all':<20}{res['instances']:>10}{res['map50']:>8.3f}{res['map']:>9.3f}",
    ]
    for name, r in sorted(res["per_class"].items(), key=lambda kv: -kv[1]["instances"]):
        rows.append(f"{name:<20}{r['instances']:>10}{r['ap50']:>8.3f}{r['ap']:>9.3f}")
    return "\n".join(rows)
