"""The run folder's pictures: training curves (results.png), precision/recall/F1 curves, the confusion matrix, the
labels' statistics, the first training batches as trained (mosaics with their boxes) and a validation batch with
labels beside predictions."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from yolov9.core import figures
from yolov9.core.boxes import xywh2xyxy
from yolov9.core.draw import draw_detections


class BackgroundPlots:
    """The pictures drawn during training (labels.jpg, the first training batches). With `background` (training on
    a GPU) they are drawn one at a time on a thread of their own, in time the training thread would spend waiting for
    the GPU, instead of before the first step and between the first steps; on the CPU the training step needs the
    cores, so they are drawn at once. A picture that fails does not stop training: `close` waits for the rest and
    names the failures."""

    def __init__(self, background: bool):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="plots") if background else None
        self._jobs: list[tuple[Path, Future]] = []

    def submit(self, draw: Callable[..., Path], *args, out: Path) -> None:
        """draw(*args, out); the arguments must not change afterwards (pass copies)."""
        if self._pool is not None:
            job = self._pool.submit(draw, *args, out)
        else:
            job = Future()
            try:
                job.set_result(draw(*args, out))
            except Exception as e:
                job.set_exception(e)
        self._jobs.append((out, job))

    def close(self) -> list[str]:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        return [f"{out.name}: {f.exception()}" for out, f in self._jobs if f.exception() is not None]


BATCH_TILES = 16  # images of a batch that plot_batch draws

# results.png: (row key, title) per panel; rows without a key (no validation that epoch) leave gaps
RESULT_PANELS = [
    ("box", "train/box_loss"),
    ("cls", "train/cls_loss"),
    ("dfl", "train/dfl_loss"),
    ("precision", "metrics/precision"),
    ("recall", "metrics/recall"),
    ("val_box", "val/box_loss"),
    ("val_cls", "val/cls_loss"),
    ("val_dfl", "val/dfl_loss"),
    ("map50", "metrics/mAP50"),
    ("map", "metrics/mAP50-95"),
]


def plot_results(rows: list[dict], out: Path) -> Path | None:
    if not rows:
        return None
    fig, axes = figures.subplots(2, 5, figsize=(18, 6.5))
    for ax, (key, title) in zip(axes.ravel(), RESULT_PANELS):
        pts = [(r["epoch"], r[key]) for r in rows if r.get(key) is not None]
        if pts:
            ax.plot(*zip(*pts), marker=".", linewidth=1.5)
        ax.set_title(title)
        ax.set_xlabel("epoch")
    return figures.save(fig, out)


def _curve(x, ys, names, axes: tuple[str, str, str], out: Path, mark: float | None = None) -> None:
    """One line per class and their mean (thick); axes: x label, y label, the mean's legend."""
    xlabel, ylabel, title = axes
    mean = ys.mean(0)
    fig, ax = figures.subplots(figsize=(8, 6))
    for y, name in zip(ys, names):
        ax.plot(x, y, linewidth=1, alpha=0.6 if len(names) < 21 else 0.25, label=name if len(names) < 21 else None)
    ax.plot(x, mean, linewidth=3, color="blue", label=f"all classes {title}")
    if mark is not None:
        ax.axvline(mark, color="gray", linestyle="--", linewidth=1)
    ax.set(xlabel=xlabel, ylabel=ylabel, xlim=(0, 1), ylim=(0, 1.01))
    ax.legend(bbox_to_anchor=(1.04, 1), loc="upper left", fontsize=8)
    ax.set_title(f"{ylabel}-{xlabel} curve")
    figures.save(fig, out)


def plot_curves(curves: dict, names: list[str], run_dir: Path) -> list[Path]:
    """PR_curve.png (IoU 0.5), F1_curve.png, P_curve.png and R_curve.png against the confidence threshold, one line
    per class with ground truth and the mean of them."""
    keep = curves["instances"] > 0
    cls_names = [n for n, k in zip(names, keep) if k]
    conf, best = curves["conf"], curves["best_conf"]
    pr = curves["pr"][keep]
    _curve(curves["recall_points"], pr, cls_names, ("Recall", "Precision", f"{pr.mean():.3f} mAP@0.5"),
           run_dir / "PR_curve.png")  # fmt: skip
    out = [run_dir / "PR_curve.png"]
    for key, label, name in (("f1", "F1", "F1_curve.png"), ("precision", "Precision", "P_curve.png"),
                             ("recall", "Recall", "R_curve.png")):  # fmt: skip
        ys = curves[key][keep]
        i = int(np.abs(conf - best).argmin())
        _curve(conf, ys, cls_names, ("Confidence", label, f"{ys.mean(0)[i]:.2f} at {best:.3f}"), run_dir / name,
               mark=best)  # fmt: skip
        out.append(run_dir / name)
    return out


def plot_confusion(matrix: np.ndarray, names: list[str], out: Path, normalize: bool = False) -> Path:
    """Rows predicted, columns true class, with background last; normalised per true class when asked. Classes
    that neither occur nor are predicted are left out, so a few of 80 classes stay readable."""
    used = np.flatnonzero(matrix.sum(0) + matrix.sum(1))
    used = np.union1d(used, [len(names)])  # background stays
    m = matrix[np.ix_(used, used)].astype(float)
    if normalize:
        m = m / np.maximum(m.sum(0, keepdims=True), 1)
    labels = [[*names, "background"][i] for i in used]
    n = len(labels)
    size = max(6, min(0.35 * n + 2, 26))
    fig, ax = figures.subplots(figsize=(size, size * 0.85))
    im = ax.imshow(np.where(m > 0, m, np.nan), cmap="Blues", vmin=0)
    fig.colorbar(im, ax=ax, fraction=0.046)
    ticks = range(n) if n <= 40 else []
    ax.set_xticks(list(ticks), [labels[i] for i in ticks], rotation=90, fontsize=7)
    ax.set_yticks(list(ticks), [labels[i] for i in ticks], fontsize=7)
    if n <= 30:
        for (r, c), v in np.ndenumerate(m):
            if v > 0:
                ax.text(c, r, f"{v:.2f}" if normalize else f"{int(v)}", ha="center", va="center", fontsize=6)
    ax.set(xlabel="True", ylabel="Predicted", title="Confusion matrix" + (" (normalised)" if normalize else ""))
    return figures.save(fig, out)


def plot_labels(labels: list[np.ndarray], names: list[str], out: Path) -> Path:
    """labels.jpg: instances per class, box centres and box sizes (normalised), and 500 boxes drawn centred."""
    lab = np.concatenate([x for x in labels if len(x)] or [np.zeros((0, 5), np.float32)])
    fig, axes = figures.subplots(2, 2, figsize=(10, 10))
    counts = np.bincount(lab[:, 0].astype(int), minlength=len(names))
    axes[0, 0].bar(range(len(names)), counts, color="tab:blue")
    axes[0, 0].set(ylabel="instances", title=f"{len(lab)} boxes, {int((counts > 0).sum())} of {len(names)} classes")
    if len(names) <= 30:
        axes[0, 0].set_xticks(range(len(names)), names, rotation=90, fontsize=8)
    canvas = np.full((500, 500, 3), 255, np.uint8)
    img = Image.fromarray(canvas)
    boxes = [{"box": b, "class_id": int(c), "class_name": ""} for c, *b in _centred(lab[:500])]
    axes[0, 1].imshow(draw_detections(img, boxes, label=False))
    axes[0, 1].axis("off")
    axes[0, 1].set_title("boxes, centred")
    axes[1, 0].hist2d(lab[:, 1], lab[:, 2], bins=50, range=[[0, 1], [0, 1]], cmap="Blues")
    axes[1, 0].set(xlabel="x", ylabel="y", title="box centres")
    axes[1, 1].hist2d(lab[:, 3], lab[:, 4], bins=50, range=[[0, 1], [0, 1]], cmap="Blues")
    axes[1, 1].set(xlabel="width", ylabel="height", title="box sizes")
    return figures.save(fig, out)


def _centred(lab: np.ndarray) -> list[list[float]]:
    return [[c, 250 - w * 250, 250 - h * 250, 250 + w * 250, 250 + h * 250] for c, _, _, w, h in lab.tolist()]


def plot_batch(
    images: torch.Tensor, boxes: list[torch.Tensor], names: list[str], out: Path, scores: bool = False
) -> Path:
    """Up to BATCH_TILES uint8 images (B, 3, H, W) in a grid with their boxes: per image (n, 5) class, x1, y1, x2,
    y2, or with `scores` (n, 6) x1, y1, x2, y2, score, class."""
    n = min(len(images), BATCH_TILES)
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    h, w = images.shape[2:]
    scale = min(1.0, 1920 / (cols * w))
    th, tw = int(h * scale), int(w * scale)
    grid = Image.new("RGB", (cols * tw, rows * th), (255, 255, 255))
    for k in range(n):
        tile = Image.fromarray(images[k].permute(1, 2, 0).numpy())
        dets = []
        for b in boxes[k].tolist():
            cls, box, score = (int(b[5]), b[:4], b[4]) if scores else (int(b[0]), b[1:5], None)
            det = {"box": box, "class_id": cls, "class_name": names[cls] if cls < len(names) else str(cls)}
            dets.append({**det, "score": score} if score is not None else det)
        tile = draw_detections(tile, dets).resize((tw, th))
        grid.paste(tile, ((k % cols) * tw, (k // cols) * th))
    grid.save(out, quality=90)
    return out


def training_batch_boxes(rows: torch.Tensor, images: int, hw: tuple[int, int]) -> list[torch.Tensor]:
    """Target rows (n, 6) image, class, x, y, w, h normalised -> for each of the first `images` images (m, 5) class,
    x1, y1, x2, y2 pixels."""
    h, w = hw
    rows = rows.cpu().float()
    out = []
    for i in range(images):
        t = rows[rows[:, 0] == i, 1:]
        out.append(torch.cat((t[:, :1], xywh2xyxy(t[:, 1:] * torch.tensor([w, h, w, h]))), 1))
    return out
