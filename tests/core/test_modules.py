"""Building blocks: the shifted-sum 2x2 average pool, the broadcast nearest upsampling and the sliced max pool that
GPU training uses are the operators they replace, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from yolov9.core.modules import SP, Upsample, _nearest_by_expand, _shift_avg_pool_2x2, _ShiftAvgPool2x2, max_pool_same


def _both(fn, ref, a: torch.Tensor, b: torch.Tensor):
    """fn on a copy of a and ref on a copy of b, one random gradient through both: outputs and input gradients."""
    a, b = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    out, want = fn(a), ref(b)
    g = torch.randn_like(want)
    out.backward(g)
    want.backward(g)
    return out, want, a.grad, b.grad


@pytest.mark.parametrize("pool", [_ShiftAvgPool2x2.apply, _shift_avg_pool_2x2], ids=["eager", "compiled-form"])
def test_shifted_sum_pool_is_avg_pool2d_forward_and_backward(pool):
    """Eager training takes the autograd Function (its own backward); torch.compile traces the plain ops."""
    x = torch.randn(2, 6, 9, 11, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(pool, (x,))
    torch.testing.assert_close(pool(x), F.avg_pool2d(x, 2, 1, 0, False, True))
    cl = x.detach().float().contiguous(memory_format=torch.channels_last)
    out, want, grad, want_grad = _both(pool, lambda t: F.avg_pool2d(t, 2, 1, 0, False, True), cl, x.detach().float())
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(grad, want_grad)


@pytest.mark.parametrize("layout", ["channels_last", "contiguous", "channel_slice"])
@pytest.mark.parametrize(("sh", "sw"), [(2, 2), (4, 4), (2, 3)])
def test_broadcast_nearest_upsampling_is_interpolate_forward_and_backward(layout, sh, sw):
    x = torch.randn(2, 8, 5, 7)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "channel_slice":  # what CBFuse upsamples: a split of CBLinear's channels-last output
        x = x.contiguous(memory_format=torch.channels_last)[:, 2:6]
    out, want, grad, want_grad = _both(
        lambda t: _nearest_by_expand(t, sh, sw), lambda t: F.interpolate(t, size=(5 * sh, 7 * sw), mode="nearest"), x, x
    )
    assert out.stride(1) < out.stride(3) if layout != "contiguous" else out.is_contiguous()
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(grad, want_grad)


def test_upsample_module_is_nn_upsample():
    x = torch.randn(1, 4, 6, 6)
    for kw in ({"scale_factor": 2.0, "mode": "nearest"}, {"size": (9, 9), "mode": "nearest"}, {"scale_factor": 2}):
        torch.testing.assert_close(Upsample(**kw)(x), nn.Upsample(**kw)(x))


@pytest.mark.parametrize("k", [3, 5])
def test_sliced_max_pool_is_max_pool2d_forward_and_backward(k):
    """Distinct values (no ties), odd sizes, channels-last: the same maxima and the gradient at the same inputs."""
    x = torch.randperm(2 * 4 * 7 * 9).float().reshape(2, 4, 7, 9).contiguous(memory_format=torch.channels_last)
    out, want, grad, want_grad = _both(lambda t: max_pool_same(t, k), lambda t: F.max_pool2d(t, k, 1, k // 2), x, x)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(grad, want_grad)


def test_sp_compiled_for_training_traces_the_sliced_pool_and_for_inference_max_pool():
    """Inductor's max_pool2d lowering is slow for training on a GPU; export and inference keep the one operator."""
    traced: list[set[str]] = []

    def backend(gm, _):
        traced.append({getattr(n.target, "__name__", "") for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    sp = SP(5)
    x = torch.randn(1, 3, 8, 8)
    for training in (True, False):
        sp.train(training)
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(sp, backend=backend)(x), F.max_pool2d(x, 5, 1, 2))
    assert not any("max_pool" in t for t in traced[0]) and any("maximum" in t for t in traced[0])
    assert any("max_pool" in t for t in traced[1])


def test_sp_run_eagerly_while_another_thread_compiles_keeps_max_pool2d(monkeypatch):
    """torch.compiler.is_compiling() is true process-wide during any compile; the sliced pool must follow only
    dynamo's own trace. At a tie max_pool2d gives the gradient to one input and the sliced pool shares it."""
    x = torch.zeros(1, 1, 5, 5, requires_grad=True)
    ref = x.detach().clone().requires_grad_()
    # the module flag a compiling thread sets (torch's context manager for it is newer than some releases we run on)
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    assert torch.compiler.is_compiling()
    SP(5).train()(x).sum().backward()
    monkeypatch.undo()
    F.max_pool2d(ref, 5, 1, 2).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)
