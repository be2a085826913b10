"""Building blocks: the shifted-sum 2x2 average pool and the broadcast nearest upsampling that GPU training uses
are the operators they replace, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from yolov9.core.modules import Upsample, _nearest_by_expand, _shift_avg_pool_2x2, _ShiftAvgPool2x2


@pytest.mark.parametrize("pool", [_ShiftAvgPool2x2.apply, _shift_avg_pool_2x2], ids=["eager", "compiled-form"])
def test_shifted_sum_pool_is_avg_pool2d_forward_and_backward(pool):
    """Eager training takes the autograd Function (its own backward); torch.compile traces the plain ops."""
    x = torch.randn(2, 6, 9, 11, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(pool, (x,))
    torch.testing.assert_close(pool(x), F.avg_pool2d(x, 2, 1, 0, False, True))
    cl = x.detach().float().contiguous(memory_format=torch.channels_last).requires_grad_()
    ref = x.detach().float().requires_grad_()
    out, want = pool(cl), F.avg_pool2d(ref, 2, 1, 0, False, True)
    g = torch.randn_like(want)
    out.backward(g)
    want.backward(g)
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(cl.grad, ref.grad)


@pytest.mark.parametrize("layout", ["channels_last", "contiguous", "channel_slice"])
@pytest.mark.parametrize(("sh", "sw"), [(2, 2), (4, 4), (2, 3)])
def test_broadcast_nearest_upsampling_is_interpolate_forward_and_backward(layout, sh, sw):
    x = torch.randn(2, 8, 5, 7)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "channel_slice":  # what CBFuse upsamples: a split of CBLinear's channels-last output
        x = x.contiguous(memory_format=torch.channels_last)[:, 2:6]
    a, b = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    out, want = _nearest_by_expand(a, sh, sw), F.interpolate(b, size=(5 * sh, 7 * sw), mode="nearest")
    assert out.stride(1) < out.stride(3) if layout != "contiguous" else out.is_contiguous()
    g = torch.randn_like(want)
    out.backward(g)
    want.backward(g)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(a.grad, b.grad)


def test_upsample_module_is_nn_upsample():
    x = torch.randn(1, 4, 6, 6)
    for kw in ({"scale_factor": 2.0, "mode": "nearest"}, {"size": (9, 9), "mode": "nearest"}, {"scale_factor": 2}):
        torch.testing.assert_close(Upsample(**kw)(x), nn.Upsample(**kw)(x))
