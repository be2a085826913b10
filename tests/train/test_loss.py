"""The detection loss reproduces the official values (single and dual head) and takes target rows with padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from yolov9.core.boxes import make_anchors
from yolov9.train.data.targets import pad_rows
from yolov9.train.loss import DetectionLoss, TaskAlignedAssigner


@pytest.mark.parametrize("name,heads", [("yolov9-s", 2), ("gelan-c", 1)])
def test_loss_matches_official(interop, name, heads):
    ref = np.load(interop / f"{name}.ref.npz")
    feats = [[torch.from_numpy(ref[f"train_out_{h}_{lv}"]) for lv in range(3)] for h in range(heads)]
    preds = feats if heads == 2 else feats[0]
    weights = (0.25, 1.0) if heads == 2 else (1.0,)
    loss_fn = DetectionLoss(80, torch.tensor([8.0, 16.0, 32.0]), head_weights=weights)
    loss, items = loss_fn(preds, torch.from_numpy(ref["targets"]))
    assert abs(loss.item() - float(ref["loss"])) / float(ref["loss"]) < 1e-4
    assert np.all(np.abs(items.numpy() - ref["loss_items"]) / ref["loss_items"] < 1e-4)
    if heads == 2:  # each head alone equals the official single-head loss of that head
        for h in range(2):
            _, per = DetectionLoss(80, torch.tensor([8.0, 16.0, 32.0]))(feats[h], torch.from_numpy(ref["targets"]))
            assert np.all(np.abs(per.numpy() - ref["loss_items_per_head"][h]) / ref["loss_items_per_head"][h] < 1e-4)
    padded = pad_rows(torch.from_numpy(ref["targets"]), 64)
    loss2, _ = loss_fn(preds, padded)
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-6)
    loss_fn.assigner.max_elements = 1  # one box row per assigner chunk: still the official value
    loss3, _ = loss_fn(preds, padded)
    assert loss3.item() == loss2.item()


def test_loss_without_targets_is_finite_and_has_no_box_terms():
    feats = [torch.randn(2, 144, s, s, requires_grad=True) for s in (8, 4, 2)]
    loss, items = DetectionLoss(80, torch.tensor([8.0, 16.0, 32.0]))(feats, torch.zeros(0, 6))
    loss.backward()
    assert torch.isfinite(loss) and items[0] == 0 and items[2] == 0 and items[1] > 0


def _crowded_batch(b: int = 5, n: int = 12, nc: int = 7, size: int = 256):
    """Predictions and many overlapping boxes (anchors claimed by several boxes), as n rows per image of which
    some are padding (all zero), in the middle of an image's rows too."""
    g = torch.Generator().manual_seed(0)
    feats = [torch.zeros(1, 1, size // s, size // s) for s in (8, 16, 32)]
    anchors, strides = make_anchors(feats, torch.tensor([8.0, 16.0, 32.0]), 0.5)
    anchors = anchors * strides
    a = anchors.shape[0]
    centre, wh = torch.rand(b, a, 2, generator=g) * size, torch.rand(b, a, 2, generator=g) * 80 + 2
    pd_bboxes = torch.cat((centre - wh / 2, centre + wh / 2), -1)
    centre, wh = torch.rand(b * n, 2, generator=g) * size, torch.rand(b * n, 2, generator=g) * 120 + 8
    mask = (torch.rand(b * n, 1, generator=g) > 0.25).float()
    gt_bboxes = torch.cat((centre - wh / 2, centre + wh / 2), -1) * mask
    labels = torch.randint(0, nc, (b * n, 1), generator=g).float() * mask
    image = torch.arange(b).repeat_interleave(n)
    return torch.rand(b, a, nc, generator=g), pd_bboxes, anchors, image, labels, gt_bboxes, mask


def test_assigner_in_chunks_gives_the_same_assignment():
    batch = _crowded_batch()
    whole = TaskAlignedAssigner(7)(*batch)
    assert whole[2].sum() > 20 and (whole[2].sum(1) > 0).all()
    for max_elements in (1, 7 * batch[2].shape[0]):  # one box row per chunk; seven
        for got, want in zip(TaskAlignedAssigner(7, max_elements=max_elements)(*batch), whole):
            assert torch.equal(got, want)


def test_the_assignment_depends_on_each_images_boxes_not_on_the_padding():
    """The same boxes without their padding rows, and then with all-zero rows after them (which a captured step's
    buffer holds), give the same foreground and targets: ties go to the first of an image's boxes either way."""
    batch = _crowded_batch()
    pd_scores, pd_bboxes, anchors, image, labels, boxes, mask = batch
    want_boxes, want_scores, want_fg = TaskAlignedAssigner(7)(*batch)
    keep = mask.squeeze(1) > 0
    for pad in (0, 9):
        rows = (image[keep], labels[keep], boxes[keep], mask[keep])
        rows = [torch.cat((t, t.new_zeros(pad, *t.shape[1:]))) for t in rows]
        got_boxes, got_scores, got_fg = TaskAlignedAssigner(7)(pd_scores, pd_bboxes, anchors, *rows)
        assert torch.equal(got_fg, want_fg) and torch.equal(got_scores, want_scores)
        assert torch.equal(got_boxes[want_fg], want_boxes[want_fg])  # elsewhere a box of zero weight


def test_an_eager_assigner_chunks_its_rows_while_another_thread_compiles(monkeypatch):
    """The compiled assigner takes its rows whole; an eager call (the uncompiled loss while the compiled one builds
    in the background) still goes in chunks, though torch's compile flag is then true process-wide."""
    batch = _crowded_batch(b=6)
    assigner = TaskAlignedAssigner(7, max_elements=24 * batch[2].shape[0])  # 24 box rows a chunk
    calls = []
    inner = assigner._box_terms
    monkeypatch.setattr(assigner, "_box_terms", lambda *a: calls.append(len(a[4])) or inner(*a))
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)  # what a compiling thread sets
    assert torch.compiler.is_compiling()
    assigner(*batch)
    assert calls == [24, 24, 24]
