"""What validation's scoring costs (train/validate.score: pycocotools, split by class over processes from
train/scoring.PARALLEL_DETECTIONS detections): synthetic ground truth (1-14 boxes per image over 80 classes) and
PER_IMAGE jittered detections per image, scored twice in one process (the first call starts the workers). Prints one
line: images, detections per image, detections, each call's seconds, mAP50-95.

    python docs/scripts/score_bench.py 1024 213
"""

from __future__ import annotations

import sys
import time
import types

import numpy as np

from yolov9.train.validate import score


def synthetic(images: int, per_image: int, seed: int = 0) -> tuple[types.SimpleNamespace, dict, list[list[float]]]:
    """A dataset stand-in (labels, names), 640x480 image shapes and detections: the first two per true box near
    it with its class, the rest near a true box with a random class."""
    rng = np.random.default_rng(seed)
    labels = []
    for _ in range(images):
        k = rng.integers(1, 15)
        xy, wh = rng.uniform(0.2, 0.8, (k, 2)), rng.uniform(0.05, 0.3, (k, 2))
        labels.append(np.concatenate([rng.integers(0, 80, (k, 1)), xy, wh], 1).astype(np.float32))
    dets = []
    for i, lab in enumerate(labels):
        for j in range(per_image):
            c, x, y, w, h = lab[j % len(lab)]
            jit = rng.normal(0, 0.05, 4)
            cls = int(c) if j < 2 * len(lab) else int(rng.integers(0, 80))
            box = [(x - w / 2 + jit[0]) * 640, (y - h / 2 + jit[1]) * 480, max(w + jit[2], 0.01) * 640]
            dets.append([i, *box, max(h + jit[3], 0.01) * 480, float(rng.uniform(0.001, 1)), cls])
    ds = types.SimpleNamespace(labels=labels, names=[str(k) for k in range(80)])
    return ds, {i: (480, 640) for i in range(images)}, dets


def main() -> None:
    images, per_image = int(sys.argv[1]), int(sys.argv[2])
    ds, shapes, dets = synthetic(images, per_image)
    seconds = []
    for _ in range(2):
        t = time.perf_counter()
        res, _ = score(ds, shapes, dets)
        seconds.append(round(time.perf_counter() - t, 2))
    print(images, per_image, len(dets), *seconds, f"{res['map']:.6f}")


if __name__ == "__main__":
    main()
