"""Training augmentation of the official recipe (hyp.scratch-high): mosaic, mixup, random affine, HSV,
left-right flip, letterbox. Images are uint8 HWC RGB numpy arrays; boxes are pixel xyxy with a class column.
Every function takes its random generator, so a sample is a pure function of (seed, epoch, index)."""

from __future__ import annotations

import math

import cv2
import numpy as np

from yolov9.core.boxes import letterbox_params
from yolov9.core.preprocess import PAD_VALUE as PAD
from yolov9.train.config import Hyp


def letterbox_np(img: np.ndarray, size: int) -> tuple[np.ndarray, float, tuple[int, int]]:
    """Resize keeping aspect so the long side is `size`, pad to size x size; returns (img, ratio, (left, top))."""
    r, (nh, nw), (left, top), _ = letterbox_params(*img.shape[:2], size)
    if (nh, nw) != img.shape[:2]:
        img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
    out = np.full((size, size, 3), PAD, np.uint8)
    out[top : top + nh, left : left + nw] = img
    return out, r, (left, top)


def xywhn_to_xyxy(lab: np.ndarray, w: float, h: float, padw: float = 0, padh: float = 0) -> np.ndarray:
    """(n, 5) class + normalised xywh -> (n, 5) class + pixel xyxy (with an offset)."""
    out = lab.copy()
    out[:, 1] = w * (lab[:, 1] - lab[:, 3] / 2) + padw
    out[:, 2] = h * (lab[:, 2] - lab[:, 4] / 2) + padh
    out[:, 3] = w * (lab[:, 1] + lab[:, 3] / 2) + padw
    out[:, 4] = h * (lab[:, 2] + lab[:, 4] / 2) + padh
    return out


def xyxy_to_xywhn(lab: np.ndarray, w: float, h: float) -> np.ndarray:
    out = lab.copy()
    x1, y1 = np.clip(lab[:, 1], 0, w), np.clip(lab[:, 2], 0, h)
    x2, y2 = np.clip(lab[:, 3], 0, w), np.clip(lab[:, 4], 0, h)
    out[:, 1], out[:, 2] = (x1 + x2) / 2 / w, (y1 + y2) / 2 / h
    out[:, 3], out[:, 4] = (x2 - x1) / w, (y2 - y1) / h
    return out


def mosaic4(images: list[np.ndarray], labels: list[np.ndarray], size: int, rng: np.random.Generator):
    """Four images (long side already `size`) on a 2size canvas around a random centre; pixel xyxy labels."""
    s = size
    yc, xc = (int(rng.uniform(s / 2, 3 * s / 2)) for _ in range(2))
    canvas = np.full((2 * s, 2 * s, 3), PAD, np.uint8)
    out_labels = []
    for i, (img, lab) in enumerate(zip(images, labels)):
        h, w = img.shape[:2]
        if i == 0:  # top left
            x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
            x1b, y1b, x2b, y2b = w - (x2a - x1a), h - (y2a - y1a), w, h
        elif i == 1:  # top right
            x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, 2 * s), yc
            x1b, y1b, x2b, y2b = 0, h - (y2a - y1a), min(w, x2a - x1a), h
        elif i == 2:  # bottom left
            x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(2 * s, yc + h)
            x1b, y1b, x2b, y2b = w - (x2a - x1a), 0, w, min(y2a - y1a, h)
        else:  # bottom right
            x1a, y1a, x2a, y2a = xc, yc, min(xc + w, 2 * s), min(2 * s, yc + h)
            x1b, y1b, x2b, y2b = 0, 0, min(w, x2a - x1a), min(y2a - y1a, h)
        canvas[y1a:y2a, x1a:x2a] = img[y1b:y2b, x1b:x2b]
        out_labels.append(xywhn_to_xyxy(lab, w, h, x1a - x1b, y1a - y1b))
    lab = np.concatenate(out_labels, 0)
    lab[:, 1:] = np.clip(lab[:, 1:], 0, 2 * s)
    return canvas, lab


def random_affine(img: np.ndarray, lab: np.ndarray, hyp: Hyp, rng: np.random.Generator, border: int = 0):
    """Rotation, scale, shear, perspective and translation in one warp; boxes follow, degenerate ones drop."""
    h, w = img.shape[0] + 2 * border, img.shape[1] + 2 * border
    C = np.eye(3)
    C[0, 2], C[1, 2] = -img.shape[1] / 2, -img.shape[0] / 2
    P = np.eye(3)
    P[2, 0], P[2, 1] = rng.uniform(-hyp.perspective, hyp.perspective), rng.uniform(-hyp.perspective, hyp.perspective)
    R = np.eye(3)
    a, s = rng.uniform(-hyp.degrees, hyp.degrees), rng.uniform(1 - hyp.scale, 1 + hyp.scale)
    R[:2] = cv2.getRotationMatrix2D(angle=a, center=(0, 0), scale=s)
    S = np.eye(3)
    S[0, 1] = math.tan(rng.uniform(-hyp.shear, hyp.shear) * math.pi / 180)
    S[1, 0] = math.tan(rng.uniform(-hyp.shear, hyp.shear) * math.pi / 180)
    T = np.eye(3)
    T[0, 2] = rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate) * w
    T[1, 2] = rng.uniform(0.5 - hyp.translate, 0.5 + hyp.translate) * h
    M = T @ S @ R @ P @ C
    if border != 0 or (M != np.eye(3)).any():
        if hyp.perspective:
            img = cv2.warpPerspective(img, M, dsize=(w, h), borderValue=(PAD, PAD, PAD))
        else:
            img = cv2.warpAffine(img, M[:2], dsize=(w, h), borderValue=(PAD, PAD, PAD))
    n = len(lab)
    if n:
        xy = np.ones((n * 4, 3))
        xy[:, :2] = lab[:, [1, 2, 3, 4, 1, 4, 3, 2]].reshape(n * 4, 2)
        xy = xy @ M.T
        xy = (xy[:, :2] / xy[:, 2:3] if hyp.perspective else xy[:, :2]).reshape(n, 8)
        x, y = xy[:, [0, 2, 4, 6]], xy[:, [1, 3, 5, 7]]
        new = np.stack((x.min(1), y.min(1), x.max(1), y.max(1)), 1)
        new[:, [0, 2]] = new[:, [0, 2]].clip(0, w)
        new[:, [1, 3]] = new[:, [1, 3]].clip(0, h)
        keep = box_candidates(lab[:, 1:5].T * s, new.T)
        lab = np.concatenate((lab[keep, :1], new[keep]), 1).astype(np.float32)
    return img, lab


def box_candidates(box1, box2, wh_thr: float = 2, ar_thr: float = 100, area_thr: float = 0.1, eps: float = 1e-16):
    """Boxes that stay > wh_thr px, keep > area_thr of their area and an aspect ratio < ar_thr after warping."""
    w1, h1 = box1[2] - box1[0], box1[3] - box1[1]
    w2, h2 = box2[2] - box2[0], box2[3] - box2[1]
    ar = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (w2 > wh_thr) & (h2 > wh_thr) & (w2 * h2 / (w1 * h1 + eps) > area_thr) & (ar < ar_thr)


def augment_hsv(img: np.ndarray, hyp: Hyp, rng: np.random.Generator) -> np.ndarray:
    if not (hyp.hsv_h or hyp.hsv_s or hyp.hsv_v):
        return img
    r = rng.uniform(-1, 1, 3) * [hyp.hsv_h, hyp.hsv_s, hyp.hsv_v] + 1
    hue, sat, val = cv2.split(cv2.cvtColor(img, cv2.COLOR_RGB2HSV))
    x = np.arange(0, 256, dtype=r.dtype)
    lut_hue = ((x * r[0]) % 180).astype(np.uint8)
    lut_sat = np.clip(x * r[1], 0, 255).astype(np.uint8)
    lut_val = np.clip(x * r[2], 0, 255).astype(np.uint8)
    hsv = cv2.merge((cv2.LUT(hue, lut_hue), cv2.LUT(sat, lut_sat), cv2.LUT(val, lut_val)))
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def flips(img: np.ndarray, lab: np.ndarray, hyp: Hyp, rng: np.random.Generator):
    """Flips on normalised xywh labels."""
    if rng.random() < hyp.flipud:
        img = np.flipud(img)
        lab[:, 2] = 1 - lab[:, 2]
    if rng.random() < hyp.fliplr:
        img = np.fliplr(img)
        lab[:, 1] = 1 - lab[:, 1]
    return np.ascontiguousarray(img), lab


def mixup(img: np.ndarray, lab: np.ndarray, img2: np.ndarray, lab2: np.ndarray, rng: np.random.Generator):
    r = rng.beta(32.0, 32.0)
    img = (img.astype(np.float32) * r + img2.astype(np.float32) * (1 - r)).astype(np.uint8)
    return img, np.concatenate((lab, lab2), 0)
