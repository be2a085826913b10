"""Building blocks: the shifted-sum 2x2 average pool that GPU training uses is the pooling operator, forward and
backward."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from yolov9.core.modules import _ShiftAvgPool2x2


def test_shifted_sum_pool_is_avg_pool2d_forward_and_backward():
    x = torch.randn(2, 6, 9, 11, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_ShiftAvgPool2x2.apply, (x,))
    torch.testing.assert_close(_ShiftAvgPool2x2.apply(x), F.avg_pool2d(x, 2, 1, 0, False, True))
    cl = x.detach().float().contiguous(memory_format=torch.channels_last).requires_grad_()
    ref = x.detach().float().requires_grad_()
    out, want = _ShiftAvgPool2x2.apply(cl), F.avg_pool2d(ref, 2, 1, 0, False, True)
    g = torch.randn_like(want)
    out.backward(g)
    want.backward(g)
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(cl.grad, ref.grad)
