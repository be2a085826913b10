"""Building blocks: the shifted-sum 2x2 average pool, the broadcast nearest upsampling and the sliced max pool that
GPU training uses are the operators they replace, forward and backward."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import requires_cuda
from yolov9.core.modules import (
    SP,
    Conv,
    Upsample,
    _nearest_by_expand,
    _shift_avg_pool_2x2,
    _ShiftAvgPool2x2,
    max_pool_same,
)


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


def _conv_reference(conv: Conv) -> nn.Sequential:
    """The same weights as the plain modules: Conv2d, BatchNorm2d, out-of-place SiLU."""
    ref = nn.Sequential(nn.Conv2d(1, 1, 1), nn.BatchNorm2d(1), nn.SiLU())
    ref[0], ref[1] = copy.deepcopy(conv.conv), copy.deepcopy(conv.bn)
    return ref


def _train_step(m: nn.Module, x: torch.Tensor, grad: torch.Tensor, amp: bool) -> list[torch.Tensor]:
    """The output, the input's gradient and every parameter's gradient of one step, in float64."""
    m.zero_grad()
    x = x.detach().clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        out = m(x)
    out.backward(grad.to(out.dtype))
    return [t.double() for t in (out, x.grad, *(p.grad for p in m.parameters()))]


def _same_statistics(bn: nn.BatchNorm2d, ref: nn.BatchNorm2d) -> None:
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(bn, name), getattr(ref, name).to(getattr(bn, name).dtype))


def test_conv_training_recomputes_batchnorm_like_the_modules():
    """Eager training's BatchNorm+SiLU (the torch path, float64): the output, every gradient and the running
    statistics of the modules it replaces, over two steps."""
    torch.manual_seed(0)
    conv = Conv(6, 8, 3, 2).double().train()
    ref = _conv_reference(conv)
    for _ in range(2):
        x = torch.randn(4, 6, 10, 12, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
        grad = torch.randn(4, 8, 5, 6, dtype=torch.float64)
        for got, want in zip(_train_step(conv, x, grad, False), _train_step(ref, x, grad, False), strict=True):
            torch.testing.assert_close(got, want)
        _same_statistics(conv.bn, ref[1])


@requires_cuda
def test_conv_training_in_fp16_on_a_gpu_is_as_accurate_as_the_modules():
    """As the trainer runs it (autocast fp16, channels-last, cuDNN's BatchNorm, the fused Triton kernel): every
    result is as close to float64's as the modules' own fp16 results are (the recomputed values are not rounded
    to fp16 before SiLU's gradient, so they differ from the modules' by rounding)."""
    torch.manual_seed(0)
    conv = Conv(16, 32, 3, 2).cuda().train()
    ref, exact = _conv_reference(conv), _conv_reference(conv).double()
    x = torch.randn(8, 16, 40, 48, device="cuda").contiguous(memory_format=torch.channels_last)
    grad = torch.randn(8, 32, 20, 24, device="cuda")
    got, mod = _train_step(conv, x, grad, True), _train_step(ref, x, grad, True)
    want = _train_step(exact, x.double(), grad.double(), False)
    for a, b, w in zip(got, mod, want, strict=True):
        assert (a - w).abs().max() <= 2 * (b - w).abs().max() + 1e-4 * w.abs().max()
    _same_statistics(conv.bn, ref[1])


def test_conv_training_keeps_two_activations_for_backward():
    """Its input (for the convolution) and the BatchNorm's input; the normalised activations are recomputed."""
    conv = Conv(4, 16, 3).train()
    x = torch.randn(2, 4, 32, 32, requires_grad=True)
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.numel() >= x.numel():
            kept[t.untyped_storage().data_ptr()] = t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        conv(x)
    assert sorted(kept.values()) == [x.numel(), 4 * x.numel()]


def test_conv_compiled_for_training_traces_the_modules():
    """torch.compile traces BatchNorm and SiLU as operators: inductor plans its own recomputation."""
    traced: list[set[str]] = []

    def backend(gm, _):
        traced.append({getattr(n.target, "__name__", "") for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    conv = Conv(3, 8, 3).train()
    x = torch.randn(1, 3, 8, 8, requires_grad=True)
    torch._dynamo.reset()
    torch.compile(conv, backend=backend)(x).sum().backward()
    assert traced == [{"conv2d", "batch_norm", "silu"}]


_KERNEL = """
import torch
from yolov9.core.batchnorm_silu_kernel import silu_backward_of_batchnorm
from yolov9.core.modules import _silu_backward_of_batchnorm

torch.manual_seed(0)
x = torch.randn(3, 7, 5, 6).contiguous(memory_format=torch.channels_last)
grad = torch.randn(3, 7, 5, 6)  # contiguous: the kernel takes it to x's layout
weight, bias, mean, rstd = torch.rand(7) + 0.5, torch.randn(7), torch.randn(7), torch.rand(7) + 0.5
got = silu_backward_of_batchnorm(x, grad, weight, bias, mean, rstd)
assert got.is_contiguous(memory_format=torch.channels_last)
# on the CPU the model takes its torch path: an eval-mode BatchNorm with these statistics, then SiLU's backward
torch.testing.assert_close(got, _silu_backward_of_batchnorm(x, grad, weight, bias, mean, rstd, 1e-3))
print("ok")
"""


def test_silu_backward_kernel_is_the_torch_path():
    """The fused kernel (core/batchnorm_silu_kernel.py) through Triton's interpreter, in a child process (the
    interpreter is chosen when the kernel is defined); the GPU-compiled kernel runs in the Conv test above."""
    res = subprocess.run(
        [sys.executable, "-c", _KERNEL],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]
