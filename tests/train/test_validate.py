"""Scoring: `score` configures pycocotools to match only what it reports, and must give what its standard
evaluation (all area ranges, 1/10/100 detections, `summarize`) gives."""

from __future__ import annotations

import contextlib
import functools
import io
import os

import numpy as np
import pytest
import torch
from pycocotools.cocoeval import COCOeval

from yolov9.core.checkpoint import model_from_checkpoint, read_checkpoint
from yolov9.train import scoring
from yolov9.train.data.dataset import DetectionDataset, eval_loader
from yolov9.train.data.formats import load_split, resolve_data
from yolov9.train.loss import DetectionLoss
from yolov9.train.validate import evaluate, ground_truth, score


def _detections(ds: DetectionDataset, shapes: dict, rng: np.random.Generator) -> list[list[float]]:
    """Jittered copies of each true box (some with a wrong class) and 150 random boxes of every size per image,
    all of one class present there: past COCO's 100 per image and class, so the area ranges and the detection limit
    both matter."""
    dets = []
    for i, (h, w) in shapes.items():
        crowded = int(ds.labels[i][0, 0]) if len(ds.labels[i]) else 0
        for c, x, y, bw, bh in ds.labels[i].tolist():
            for _ in range(2):
                j = rng.normal(0, 0.08, 4)
                cls = c if rng.uniform() < 0.8 else rng.integers(len(ds.names))
                x0, y0 = (x - bw / 2 + j[0] * bw) * w, (y - bh / 2 + j[1] * bh) * h
                box = [x0, y0, bw * w * (1 + j[2]), bh * h * (1 + j[3])]
                dets.append([i, *box, rng.uniform(0.05, 0.95), int(cls)])
        for _ in range(150):
            x0, y0 = rng.uniform(0, 0.9, 2) * (w, h)
            dets.append([i, x0, y0, *(rng.uniform(4, 300, 2)), rng.uniform(0.001, 0.6), crowded])
    return dets


@pytest.mark.parametrize("seed", [0, 1])
def test_score_equals_pycocotools_standard_summary(coco48, seed):
    ds = DetectionDataset(load_split(resolve_data(str(coco48)), "val"), 320, desc="val")
    shapes = {i: (480, 640) for i in range(len(ds.labels))}
    dets = _detections(ds, shapes, np.random.default_rng(seed))
    res, _ = score(ds, shapes, dets)

    gt = scoring.coco(*ground_truth(ds, shapes), list(range(len(ds.names))))
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(gt, gt.loadRes(np.array(dets, dtype=np.float64)), "bbox")
        ev.params.imgIds = sorted(shapes)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    assert 0.05 < ev.stats[0] < 0.95  # a score that the configuration could get wrong
    assert res["map"] == pytest.approx(ev.stats[0], abs=1e-12)
    assert res["map50"] == pytest.approx(ev.stats[1], abs=1e-12)
    prec = ev.eval["precision"][:, :, :, 0, -1]  # every area, 100 detections
    for k, cat in enumerate(ev.params.catIds):
        if ds.names[cat] in res["per_class"]:
            p = prec[:, :, k]
            assert res["per_class"][ds.names[cat]]["ap"] == pytest.approx(p[p > -1].mean(), abs=1e-12)


def _assert_same_scores(a: tuple[dict, dict], b: tuple[dict, dict]) -> None:
    assert a[0] == b[0]
    assert a[1].keys() == b[1].keys()
    for k, v in a[1].items():
        assert np.array_equal(v, b[1][k]) if isinstance(v, np.ndarray) else v == b[1][k], k


@pytest.fixture
def scored(coco48) -> tuple[DetectionDataset, dict, list, tuple[dict, dict]]:
    """coco48's validation split with _detections, scored in this process."""
    ds = DetectionDataset(load_split(resolve_data(str(coco48)), "val"), 320, desc="val")
    shapes = {i: (480, 640) for i in range(len(ds.labels))}
    dets = _detections(ds, shapes, np.random.default_rng(2))
    assert len(dets) < scoring.PARALLEL_DETECTIONS
    return ds, shapes, dets, score(ds, shapes, dets)


def test_scoring_split_by_class_over_processes_gives_the_serial_numbers(scored, monkeypatch):
    """Each class is matched and accumulated on its own, so workers that each take some classes give exactly what
    one process gives: every reported number and every curve."""
    ds, shapes, dets, serial = scored
    monkeypatch.setattr(scoring, "_workers", lambda n_dets, n_classes: 2)
    groups = scoring._groups(np.asarray(dets), list(range(len(ds.names))), 2)
    assert sorted(k for g in groups for k in g) == list(range(len(ds.names)))  # every class once
    _assert_same_scores(score(ds, shapes, dets), serial)
    assert scoring._pool is not None  # the workers scored it


def test_a_worker_that_dies_leaves_scoring_to_this_process(scored, monkeypatch):
    """A worker killed mid-way (here it exits at once) breaks the pool; the scores then come from this process,
    the same as ever, and the next large scoring starts a new pool."""
    ds, shapes, dets, serial = scored
    parent, real = os.getpid(), scoring.evaluate_classes

    @functools.wraps(real)  # pickled by name, so the forked workers resolve it to this function too
    def dies_in_a_worker(*args):
        if os.getpid() != parent:
            os._exit(1)
        return real(*args)

    monkeypatch.setattr(scoring, "evaluate_classes", dies_in_a_worker)
    monkeypatch.setattr(scoring, "_pool", None)  # workers forked after the patch
    monkeypatch.setattr(scoring, "_workers", lambda n_dets, n_classes: 2)
    _assert_same_scores(score(ds, shapes, dets), serial)
    assert scoring._pool is None


def test_a_model_validates_under_autocast_and_scores_like_fp32(trained_tiny, tiny_subset):
    """The trainer validates on a GPU at its training precision: the layers under autocast, the loss, the decode and
    NMS in fp32. bf16 here (the CPU's autocast dtype): the same mAP and losses as fp32 within bf16's rounding."""
    model = model_from_checkpoint(read_checkpoint(trained_tiny)).eval()
    ds = DetectionDataset(load_split(resolve_data(str(tiny_subset)), "val"), 160, desc="val")
    loader, loss_fn = eval_loader(ds, 8), DetectionLoss.for_model(model)
    fp32 = evaluate(model, loader, loss_fn=loss_fn, progress=False)
    bf16 = evaluate(model, loader, loss_fn=loss_fn, progress=False, amp=torch.bfloat16)
    assert fp32["map"] > 0.1  # a model whose score can move
    assert bf16["val_cls"] != fp32["val_cls"]  # the layers did run in bf16
    assert bf16["map"] == pytest.approx(fp32["map"], abs=0.03)
    for k in ("val_box", "val_cls", "val_dfl"):
        assert bf16[k] == pytest.approx(fp32[k], rel=0.03), k
    assert bf16["detections"] == pytest.approx(fp32["detections"], rel=0.1)
