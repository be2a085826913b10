"""The model family: official-checkpoint outputs, fusion, re-parameterization, every zoo config."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import rel_l2
from yolov9.core.checkpoint import load_model
from yolov9.core.model import DetectionModel, n_params, zoo_names

OFFICIAL_PARAMS = {"yolov9-s": 9_804_512, "gelan-c": 25_498_752}


def _outputs(model, x) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(x)
    return out if isinstance(out, list) else [out]


@pytest.mark.parametrize("name", ["yolov9-s", "gelan-c"])
def test_official_checkpoint_outputs_fused_and_unfused(interop, name):
    ref = np.load(interop / f"{name}.ref.npz")
    model = load_model(interop / f"{name}.pt")
    assert n_params(model) == OFFICIAL_PARAMS[name]
    x = torch.from_numpy(ref["images"])
    outs = _outputs(model, x)
    assert len(outs) == sum(k.startswith("pred") and not k.startswith("pred_fused") for k in ref.files)
    for i, o in enumerate(outs):
        assert o.shape == ref[f"pred{i}"].shape
        assert rel_l2(o, torch.from_numpy(ref[f"pred{i}"])) < 1e-4
    for i, o in enumerate(_outputs(model.fuse(), x)):
        assert rel_l2(o, torch.from_numpy(ref[f"pred_fused{i}"])) < 1e-4


def test_official_train_outputs_match(interop):
    """Train-mode raw maps (the loss input) match too: BN in batch-statistics mode, both heads."""
    ref = np.load(interop / "yolov9-s.ref.npz")
    model = load_model(interop / "yolov9-s.pt").train()
    with torch.no_grad():
        out = model(torch.from_numpy(ref["images"]))
    for h in range(2):
        for level in range(3):
            assert rel_l2(out[h][level], torch.from_numpy(ref[f"train_out_{h}_{level}"])) < 1e-4


def test_reparameterized_gelan_reproduces_main_head(interop):
    ref = np.load(interop / "yolov9-s.ref.npz")
    model = load_model(interop / "yolov9-s.pt")
    gelan = model.reparameterize()
    assert gelan.cfg["name"] == "gelan-s" and gelan.head.groups == 1
    x = torch.from_numpy(ref["images"])
    (main,) = _outputs(gelan, x)
    assert rel_l2(main, torch.from_numpy(ref["pred1"])) < 1e-4
    (fused,) = _outputs(gelan.fuse(), x)
    assert rel_l2(fused, torch.from_numpy(ref["pred1"])) < 1e-4


@pytest.mark.parametrize("name", zoo_names())
def test_zoo_config_builds_and_runs(name):
    torch.manual_seed(0)
    model = DetectionModel(name).eval()
    groups = model.head.groups
    assert groups == (2 if name.startswith("yolov9") else 1)
    for size in (320, 640):
        outs = _outputs(model, torch.rand(1, 3, size, size))
        anchors = sum((size // s) ** 2 for s in (8, 16, 32))
        assert [o.shape for o in outs] == [(1, 84, anchors)] * groups
    if name.endswith(("-t", "-s")):
        model.train()
        out = model(torch.rand(2, 3, 320, 320))
        loss = sum(f.float().square().mean() for head in (out if groups > 1 else [out]) for f in head)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None for g in grads) and all(torch.isfinite(g).all() for g in grads)
    if name.startswith("yolov9"):
        gelan = model.eval().reparameterize()
        assert gelan.head.groups == 1
        x = torch.rand(1, 3, 320, 320)
        assert rel_l2(_outputs(gelan, x)[0], _outputs(model, x)[-1]) < 1e-5


def test_class_count_override():
    model = DetectionModel("gelan-t", nc=3, names=["a", "b", "c"]).eval()
    (out,) = _outputs(model, torch.rand(1, 3, 320, 320))
    assert out.shape[1] == 4 + 3 and model.names == ["a", "b", "c"]
