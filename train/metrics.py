"""Detection metrics beyond pycocotools' summary, computed from its own matching: precision, recall and F1 against
the confidence threshold per class (and the operating point of best mean F1), and a confusion matrix of predicted
against true classes with a background row and column. IoU 0.5 for the curves, as Ultralytics reports them."""

from __future__ import annotations

import numpy as np
import torch
from pycocotools.cocoeval import COCOeval

from yolov9.core.detection_defaults import CONF, IOU

CONF_GRID = np.linspace(0, 1, 1000)


def pr_curves(ev: COCOeval) -> dict:
    """From an evaluated COCOeval: per class (in ev.params.catIds order) precision, recall and F1 on CONF_GRID at
    IoU 0.5, the COCO-interpolated precision-recall curve at IoU 0.5, the per-class ground-truth counts, and the
    confidence of best mean F1 with P and R there (per class and mean over classes with ground truth)."""
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
    f1 = 2 * prec * rec / np.maximum(prec + rec, 1e-16)
    has_gt = n_gt > 0
    best = int(f1[has_gt].mean(0).argmax()) if has_gt.any() else 0
    return {
        "conf": CONF_GRID,
        "precision": prec,
        "recall": rec,
        "f1": f1,
        "pr": ev.eval["precision"][0, :, :, 0, -1].T.clip(0),  # (classes, 101 recall points) at IoU 0.5
        "recall_points": p.recThrs,
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
