"""pycocotools' matching and accumulation of detections, split by class over worker processes when there are many.
pycocotools matches every (image, class) pair on its own and accumulates every class on its own, in Python, so each
class's numbers do not depend on the others: a split by class gives exactly the serial result, in a fraction of
the time on a host with idle cores (early in training a validation holds hundreds of detections per image)."""

from __future__ import annotations

import contextlib
import io
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_all_start_methods, get_context

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

CONF_GRID = np.linspace(0, 1, 1000)
# below this many detections a pool's start and transfers cost more than the split saves
PARALLEL_DETECTIONS = 20_000
MAX_WORKERS = 8

_pool: tuple[ProcessPoolExecutor, int] | None = None  # with its number of workers


def coco(images: list[dict], anns: list[dict], cat_ids: list[int]) -> COCO:
    """An in-memory COCO object of these images, annotations and category ids."""
    c = COCO()
    c.dataset = {"images": images, "annotations": anns, "categories": [{"id": k, "name": str(k)} for k in cat_ids]}
    with contextlib.redirect_stdout(io.StringIO()):
        c.createIndex()
    return c


def detection_anns(dets: np.ndarray) -> list[dict]:
    """(n, 7) rows of image id, x, y, w, h, score, class as the annotations pycocotools' loadRes makes of them
    (ids from 1 in row order, area w * h, not crowd), without the polygon that only segmentation reads."""
    cols = [dets[:, k].tolist() for k in range(7)]
    return [
        {
            "id": n + 1,
            "image_id": int(i),
            "category_id": int(c),
            "bbox": [x, y, w, h],
            "area": w * h,
            "score": s,
            "iscrowd": 0,
        }
        for n, (i, x, y, w, h, s, c) in enumerate(zip(*cols))
    ]


def class_curves(ev: COCOeval) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From an evaluated COCOeval: per class (in ev.params.catIds order) precision and recall on CONF_GRID at IoU
    0.5 from its own matches, and the ground-truth counts."""
    p = ev.params
    n_img, n_area = len(p.imgIds), len(p.areaRng)
    k_count = len(p.catIds)
    prec = np.zeros((k_count, len(CONF_GRID)))
    rec = np.zeros_like(prec)
    n_gt = np.zeros(k_count, int)
    for k in range(k_count):
        entries = [e for e in ev.evalImgs[k * n_area * n_img : k * n_area * n_img + n_img] if e is not None]
        if not entries:
            continue
        n_gt[k] = sum(int((e["gtIgnore"] == 0).sum()) for e in entries)
        scores = np.concatenate([e["dtScores"] for e in entries])
        tp = np.concatenate([e["dtMatches"][0] > 0 for e in entries])
        keep = ~np.concatenate([e["dtIgnore"][0] for e in entries]).astype(bool)
        scores, tp = scores[keep], tp[keep]
        if not len(scores) or not n_gt[k]:
            continue
        order = np.argsort(-scores, kind="mergesort")
        tpc, fpc = np.cumsum(tp[order]), np.cumsum(~tp[order])
        recall, precision = tpc / n_gt[k], tpc / (tpc + fpc)
        s = scores[order]
        rec[k] = np.interp(-CONF_GRID, -s, recall, left=0)  # recall falls as the threshold rises
        prec[k] = np.interp(-CONF_GRID, -s, precision, left=1)
    return prec, rec, n_gt


def evaluate_classes(
    images: list[dict], gt_anns: list[dict], dets: np.ndarray, img_ids: list[int], cat_ids: list[int]
) -> dict[str, np.ndarray]:
    """pycocotools' evaluation of these classes, configured to match only what is reported (every area at COCO's
    100 detections per image; its default also matches three area ranges and 1 and 10 detections, four times the
    work for the same numbers): 'precision' (IoU thresholds, recall points, classes; -1 where a class has no
    truth), the curves of class_curves as 'p', 'r' and 'n_gt', and 'recall_points'."""
    gt = coco(images, gt_anns, cat_ids)
    pred = coco(images, detection_anns(dets), cat_ids)
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt, pred, "bbox")
        ev.params.imgIds, ev.params.catIds = img_ids, cat_ids
        ev.params.areaRng, ev.params.areaRngLbl, ev.params.maxDets = [[0, 1e10]], ["all"], [100]
        ev.evaluate()
        ev.accumulate()
    p, r, n_gt = class_curves(ev)
    precision = ev.eval["precision"][..., 0, 0]
    return {"precision": precision, "p": p, "r": r, "n_gt": n_gt, "recall_points": ev.params.recThrs}


def _workers(n_dets: int, n_classes: int) -> int:
    """How many processes score: one below PARALLEL_DETECTIONS or where processes cannot fork, else one per usable
    core up to MAX_WORKERS and the number of classes."""
    if n_dets < PARALLEL_DETECTIONS or "fork" not in get_all_start_methods():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores, n_classes))


def _groups(dets: np.ndarray, cat_ids: list[int], n: int) -> list[list[int]]:
    """cat_ids in n groups of about equal detections (the largest class first to the lightest group)."""
    counts = dict(zip(*np.unique(dets[:, 6].astype(int), return_counts=True)))
    groups: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for k in sorted(cat_ids, key=lambda k: -counts.get(k, 0)):
        i = load.index(min(load))
        groups[i].append(k)
        load[i] += counts.get(k, 0) + 1
    return [sorted(g) for g in groups if g]


def _pool_of(n: int) -> ProcessPoolExecutor:
    """The module's pool of workers, kept for the next validation. Forked, as the training loader's workers are:
    a spawned worker would first run the caller's main module again, which a script without a __main__ guard
    cannot take; the workers run only this module's numpy and pycocotools code."""
    global _pool
    if _pool is None or _pool[1] < n:
        if _pool is not None:
            _pool[0].shutdown()
        _pool = ProcessPoolExecutor(n, mp_context=get_context("fork")), n
    return _pool[0]


def evaluate(
    images: list[dict], gt_anns: list[dict], dets: np.ndarray, img_ids: list[int], cat_ids: list[int]
) -> dict[str, np.ndarray]:
    """evaluate_classes over every class of cat_ids, in up to MAX_WORKERS processes when there are at least
    PARALLEL_DETECTIONS detections (else, or if the pool fails, in this process); the same numbers either way."""
    global _pool
    n = _workers(len(dets), len(cat_ids))
    if n > 1:
        groups = _groups(dets, cat_ids, n)
        jobs = []
        for g in groups:
            mine = set(g)
            anns = [a for a in gt_anns if a["category_id"] in mine]
            jobs.append((images, anns, dets[np.isin(dets[:, 6], g)], img_ids, g))
        try:
            parts = list(_pool_of(n).map(evaluate_classes, *zip(*jobs)))
        except BrokenProcessPool:  # a worker died (killed, out of memory): the serial path still scores
            _pool[0].shutdown(wait=False)
            _pool = None
        else:
            return _merged(parts, groups, cat_ids)
    return evaluate_classes(images, gt_anns, dets, img_ids, cat_ids)


def _merged(parts: list[dict], groups: list[list[int]], cat_ids: list[int]) -> dict[str, np.ndarray]:
    """The groups' results as one evaluation of cat_ids, classes in cat_ids' sorted order as pycocotools keeps
    them."""
    order = sorted(cat_ids)
    where = {k: (i, j) for i, g in enumerate(groups) for j, k in enumerate(g)}

    def pick(key: str, axis: int) -> np.ndarray:
        return np.stack([np.take(parts[where[k][0]][key], where[k][1], axis) for k in order], axis)

    return {
        "precision": pick("precision", 2),
        "p": pick("p", 0),
        "r": pick("r", 0),
        "n_gt": pick("n_gt", 0),
        "recall_points": parts[0]["recall_points"],
    }
