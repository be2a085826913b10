"""Detection metrics beyond pycocotools' summary, from its own matching (train/scoring.py): precision, recall and
F1 against the confidence threshold per class (and the operating point of best mean F1), and a confusion matrix of
predicted against true classes with a background row and column. IoU 0.5 for the curves, as Ultralytics reports them."""

from __future__ import annotations

import numpy as np
import torch

from yolov9.core.detection_defaults import CONF, IOU
from yolov9.train.scoring import CONF_GRID


def pr_curves(scores: dict[str, np.ndarray]) -> dict:
    """From scoring.evaluate's per-class precision and recall on CONF_GRID at IoU 0.5 (classes in its order): F1,
    the COCO-interpolated precision-recall curve at IoU 0.5, the per-class ground-truth counts, and the confidence
    of best mean F1 with P and R there (per class and mean over classes with ground truth)."""
    prec, rec, n_gt = scores["p"], scores["r"], scores["n_gt"]
    f1 = 2 * prec * rec / np.maximum(prec + rec, 1e-16)
    has_gt = n_gt > 0
    best = int(f1[has_gt].mean(0).argmax()) if has_gt.any() else 0
    return {
        "conf": CONF_GRID,
        "precision": prec,
        "recall": rec,
        "f1": f1,
        "pr": scores["precision"][0].T.clip(0),  # (classes, 101 recall points) at IoU 0.5
        "recall_points": scores["recall_points"],
        "instances": n_gt,
        "best_conf": float(CONF_GRID[best]),
        "p_at_best": prec[:, best],
        "r_at_best": rec[:, best],
        "mean_p": float(prec[has_gt, best].mean()) if has_gt.any() else 0.0,
        "mean_r": float(rec[has_gt, best].mean()) if has_gt.any() else 0.0,
    }


def confusion_matrix(
    dets: list[torch.Tensor], gts: list[torch.Tensor], nc: int, conf: float = CONF, iou: float = IOU
) -> np.ndarray:
    """(nc + 1, nc + 1) counts, rows predicted class, columns true class, index nc background. dets per image
    (n, 6) x1, y1, x2, y2, score, class; gts per image (m, 5) class, x1, y1, x2, y2, in the same pixel frame. A
    ground-truth box matched by no detection (IoU > iou, one detection per box, best IoU first) is a background
    prediction; a detection above conf that matches nothing is a background truth."""
    import torchvision  # imported at first use (core/decode.decode_image)

    m = np.zeros((nc + 1, nc + 1), np.int64)
    for det, gt in zip(dets, gts):
        det = det[det[:, 4] > conf]
        gc = gt[:, 0].long().tolist()
        if not len(det):
            for c in gc:
                m[nc, c] += 1
            continue
        dc = det[:, 5].long().tolist()
        if not len(gt):
            for c in dc:
                m[c, nc] += 1
            continue
        overlap = torchvision.ops.box_iou(gt[:, 1:], det[:, :4])
        gi, di = torch.nonzero(overlap > iou, as_tuple=True)
        matches = np.stack([gi.numpy(), di.numpy(), overlap[gi, di].numpy()], 1) if len(gi) else np.zeros((0, 3))
        if len(matches):
            matches = matches[matches[:, 2].argsort()[::-1]]
            matches = matches[np.unique(matches[:, 1], return_index=True)[1]]
            matches = matches[matches[:, 2].argsort()[::-1]]
            matches = matches[np.unique(matches[:, 0], return_index=True)[1]]
        matched_gt = {int(g): int(d) for g, d, _ in matches}
        for j, c in enumerate(gc):
            m[dc[matched_gt[j]] if j in matched_gt else nc, c] += 1
        matched_det = set(matched_gt.values())
        for j, c in enumerate(dc):
            if j not in matched_det:
                m[c, nc] += 1
    return m
