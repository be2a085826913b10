"""`--compile`: the compiled forward computes what the model computes, compiles once for the first input shape and
runs any other shape uncompiled, and leaves the model (its keys, its EMA copy) as it was. On the CPU dynamo traces
with its 'eager' backend (inductor's C++ compile of even a small model takes minutes on two cores); the inductor
path with CUDA graphs is tested on the GPU in test_step.py."""

from __future__ import annotations

import copy

import pytest
import torch

from yolov9.core.model import DetectionModel
from yolov9.train.compiled import CompiledForward, cache_dir, compiled


def _outputs(out) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in _outputs(o)]


@pytest.mark.parametrize(("cfg", "mode"), [("gelan-t", "layers"), ("yolov9-t", "model")])
def test_compiled_forward_traces_once_and_runs_other_shapes_uncompiled(cfg, mode):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = DetectionModel(cfg, nc=3).train()
    keys = list(model.state_dict())
    net = CompiledForward(model, mode, backend="eager")
    x = torch.rand(2, 3, 64, 64)
    got = net(x)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= (1 if mode == "model" else len(model.model) // 2)
    want = model(x)
    for a, b in zip(_outputs(got), _outputs(want), strict=True):
        torch.testing.assert_close(a, b)
    net(torch.rand(2, 3, 64, 64))  # the same shape again: no new trace
    short = torch.rand(1, 3, 64, 64)  # an epoch's short last batch
    for a, b in zip(_outputs(net(short)), _outputs(model(short)), strict=True):
        torch.testing.assert_close(a, b)
    assert counters["stats"]["unique_graphs"] == graphs
    sum(t.float().square().mean() for t in _outputs(net(x))).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert list(model.state_dict()) == keys and list(net.parameters()) == list(model.parameters())
    plain = copy.deepcopy(model)  # what ModelEMA and checkpoints copy: the model, not its compiled regions
    assert type(plain) is DetectionModel and not hasattr(plain, "_calls")


def test_compile_off_is_the_model_itself():
    model = DetectionModel("gelan-t", nc=3)
    assert compiled(model, "off") is model
    with pytest.raises(ValueError, match="choose layers, model"):
        CompiledForward(model, "everything")


def test_inductor_cache_lives_in_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "yolov9" / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "own"))
    assert cache_dir() == tmp_path / "own"
