"""The detection loss reproduces the official values (single and dual head) and takes padded targets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from train.loss import DetectionLoss, pad_targets


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
    padded = pad_targets(torch.from_numpy(ref["targets"]), 2)
    assert padded.shape == (2, 8, 5) and torch.all(padded[0, 7] == 0)
    loss2, _ = loss_fn(preds, padded, padded=True)
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-6)


def test_loss_without_targets_is_finite_and_has_no_box_terms():
    feats = [torch.randn(2, 144, s, s, requires_grad=True) for s in (8, 4, 2)]
    loss, items = DetectionLoss(80, torch.tensor([8.0, 16.0, 32.0]))(feats, torch.zeros(0, 6))
    loss.backward()
    assert torch.isfinite(loss) and items[0] == 0 and items[2] == 0 and items[1] > 0
