"""The backward of SiLU after a BatchNorm whose output was not kept, in one GPU kernel (Triton): each element's
normalised value is recomputed from the BatchNorm's input as x * scale[c] + shift[c] and the SiLU's gradient
applied to it, reading x and the incoming gradient once and writing the BatchNorm's output gradient once: what
SiLU's own backward costs when the normalised values are stored. Channels-last tensors only (channels vary
fastest); core/modules.py keeps a torch path for the rest."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048


@triton.jit
def _silu_backward_of_affine(x, dy, affine, dz, n, C, BLOCK: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = p < n
    c = p % C
    z = tl.load(x + p, mask=m, other=0).to(tl.float32) * tl.load(affine + c, mask=m) + tl.load(affine + C + c, mask=m)
    g = tl.load(dy + p, mask=m, other=0).to(tl.float32)
    s = tl.sigmoid(z)
    tl.store(dz + p, (g * s * (1.0 + z * (1.0 - s))).to(dz.dtype.element_ty), mask=m)


def silu_backward_of_batchnorm(
    x: torch.Tensor,
    grad: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
) -> torch.Tensor:
    """grad times SiLU's derivative at the training-mode BatchNorm output of x (the batch's mean and 1/std, the
    BatchNorm's weight and bias); x channels-last, the result too."""
    affine = torch.empty(2, x.shape[1], device=x.device)  # per channel: scale, then shift
    torch.mul(rstd, weight, out=affine[0])
    torch.addcmul(bias, mean, affine[0], value=-1, out=affine[1])
    grad = grad.contiguous(memory_format=torch.channels_last)
    dz = torch.empty_like(x, memory_format=torch.channels_last)
    n = x.numel()
    _silu_backward_of_affine[(triton.cdiv(n, BLOCK),)](x, grad, affine, dz, n, x.shape[1], BLOCK=BLOCK)
    return dz
