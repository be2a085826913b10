"""Building blocks of the YOLOv9 / GELAN family.

Attribute names (cv1, cv2, conv1, dfl2, ...) are those of the official implementation so that state-dict keys
line up with official checkpoints; every block that holds a BatchNorm can fold it away with `fuse()`.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import fuse_conv_bn_eval

from yolov9.core.boxes import dist2bbox, make_anchors

BN_EPS = 1e-3  # the official trainer's BatchNorm settings; checkpoints depend on eps
BN_MOMENTUM = 0.03


def autopad(k: int, p: int | None = None) -> int:
    return k // 2 if p is None else p


def fold_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A conv with bias equal to conv followed by eval-mode BN (inference only)."""
    return fuse_conv_bn_eval(conv.eval(), bn.eval()).requires_grad_(False)


class _BatchNormSiLU(torch.autograd.Function):
    """Training-mode BatchNorm2d then SiLU that keeps only the BatchNorm's input for backward and recomputes the
    normalised activations there. nn.BatchNorm2d + nn.SiLU keep both, and an in-place SiLU even copies its input
    to keep it: each Conv stored three activations where two suffice. The BatchNorm itself runs as
    F.batch_norm runs it (the same cuDNN or native kernels, forward and backward)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        running_mean: torch.Tensor,
        running_var: torch.Tensor,
        momentum: float,
        eps: float,
    ) -> torch.Tensor:
        z, mean, rstd, reserve, impl = torch.ops.aten._batch_norm_impl_index(
            x, weight, bias, running_mean, running_var, True, momentum, eps, torch.backends.cudnn.enabled
        )
        ctx.save_for_backward(x, weight, bias, running_mean, running_var, mean, rstd, reserve)
        ctx.eps, ctx.impl = eps, impl
        return F.silu(z, inplace=True)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, weight, bias, running_mean, running_var, mean, rstd, reserve = ctx.saved_tensors
        dz = _silu_backward_of_batchnorm(x, grad, weight, bias, mean, rstd, ctx.eps)
        dx, dw, db = torch.ops.aten._batch_norm_impl_index_backward(
            ctx.impl,
            x,
            dz,
            weight,
            running_mean,
            running_var,
            mean,
            rstd,
            True,
            ctx.eps,
            list(ctx.needs_input_grad[:3]),
            reserve,
        )
        return dx, dw, db, None, None, None, None


def _silu_backward_of_batchnorm(
    x: torch.Tensor,
    grad: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """SiLU's input gradient at the recomputed BatchNorm output: one fused kernel on a GPU (channels-last), else
    the batch's statistics given to an eval-mode BatchNorm and SiLU's own backward."""
    if x.is_cuda and x.is_contiguous(memory_format=torch.channels_last):
        from yolov9.core.batchnorm_silu_kernel import silu_backward_of_batchnorm

        return silu_backward_of_batchnorm(x, grad, weight, bias, mean, rstd)
    z = torch.batch_norm(x, weight, bias, mean, rstd.pow(-2).sub_(eps), False, 0.0, eps, True)
    return torch.ops.aten.silu_backward(grad, z)


def _batchnorm_silu(bn: nn.BatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    if bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)  # as nn.BatchNorm2d counts; only a state-dict entry with a fixed momentum
    return _BatchNormSiLU.apply(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.momentum, bn.eps)


def _activation(act: nn.Module, y: torch.Tensor) -> torch.Tensor:
    """act(y), with the blocks' in-place SiLU out of place where autograd records: in place, it copies y to keep
    it for backward."""
    return F.silu(y) if y.requires_grad and isinstance(act, nn.SiLU) else act(y)


class Conv(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d -> SiLU."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, p: int | None = None, g: int = 1, act: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, autopad(k, p), groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act = nn.SiLU(inplace=True) if act else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self._recompute_bn_silu(y):
            return _batchnorm_silu(self.bn, y)
        return _activation(self.act, self.bn(y))

    def _recompute_bn_silu(self, y: torch.Tensor) -> bool:
        """Eager training with autograd: torch.compile (`--compile`) plans its own recomputation, and a
        SyncBatchNorm (multi-GPU) keeps its module."""
        return (
            self.training
            and y.requires_grad
            and type(self.bn) is nn.BatchNorm2d
            and isinstance(self.act, nn.SiLU)
            and not in_compiled_trace()
        )

    @torch.no_grad()
    def fuse(self) -> None:
        if isinstance(self.bn, nn.BatchNorm2d):
            self.conv = fold_bn(self.conv, self.bn)
            self.bn = nn.Identity()


class RepConvN(nn.Module):
    """3x3 + 1x1 branches in training, one 3x3 conv after `fuse()`."""

    def __init__(self, c1: int, c2: int, k: int = 3, s: int = 1, p: int = 1, g: int = 1, act: bool = True):
        super().__init__()
        self.conv1 = Conv(c1, c2, k, s, p, g, act=False)
        self.conv2 = Conv(c1, c2, 1, s, p - k // 2, g, act=False)
        self.act = nn.SiLU(inplace=True) if act else nn.Identity()
        self.conv: nn.Conv2d | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv is not None:
            return self.act(self.conv(x))
        return _activation(self.act, self.conv1(x) + self.conv2(x))

    @torch.no_grad()
    def fuse(self) -> None:
        if self.conv is not None:
            return
        k3 = fold_bn(self.conv1.conv, self.conv1.bn)
        k1 = fold_bn(self.conv2.conv, self.conv2.bn)
        k3.weight += F.pad(k1.weight, [1, 1, 1, 1])
        k3.bias += k1.bias
        self.conv = k3
        del self.conv1, self.conv2


def _shift_avg_pool_2x2(x: torch.Tensor) -> torch.Tensor:
    """`_ShiftAvgPool2x2`'s forward as differentiable ops, for torch.compile to trace."""
    rows = x[..., :-1, :] + x[..., 1:, :]
    return (rows[..., :-1] + rows[..., 1:]) * 0.25


class _ShiftAvgPool2x2(torch.autograd.Function):
    """avg_pool2d(x, 2, stride 1) as sums of shifted views, forward and backward: on the GPU in channels-last
    half precision, the pooling kernels read and write at a fraction of the memory bandwidth that these
    elementwise passes reach (docs/benchmarks.md)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        rows = x[..., :-1, :] + x[..., 1:, :]
        return (rows[..., :-1] + rows[..., 1:]).mul_(0.25)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        g = F.pad(g, (1, 1, 1, 1))
        rows = g[..., :-1, :] + g[..., 1:, :]
        return (rows[..., :-1] + rows[..., 1:]).mul_(0.25)


def _nearest_by_expand(x: torch.Tensor, sh: int, sw: int) -> torch.Tensor:
    """Nearest upsampling by integer factors as a broadcast and a reshape, in x's memory format: its backward is
    a sum over each block."""
    b, c, h, w = x.shape
    if x.stride(1) < x.stride(3):  # channels vary fastest: channels-last, or a channel slice of it (CBLinear's)
        y = x.permute(0, 2, 3, 1)[:, :, None, :, None, :].expand(b, h, sh, w, sw, c)
        return y.reshape(b, h * sh, w * sw, c).permute(0, 3, 1, 2)
    return x[:, :, :, None, :, None].expand(b, c, h, sh, w, sw).reshape(b, c, h * sh, w * sw)


def _gpu_training(x: torch.Tensor) -> bool:
    """Whether x is a GPU training activation: where the training-only forms of pooling and upsampling apply."""
    return x.is_cuda and x.requires_grad and torch.is_grad_enabled()


def upsample_nearest(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Nearest upsampling to size (nn.Upsample's and CBFuse's). Training on a GPU by an integer factor takes the
    broadcast form: the interpolation's backward (eagerly, and as inductor lowers it, with atomic adds) runs far
    below the memory bandwidth that a block sum reaches; inference and exports keep the Resize operator."""
    h, w = x.shape[2:]
    sh, sw = size[0] // h, size[1] // w
    if _gpu_training(x) and (sh * h, sw * w) == tuple(size):
        return _nearest_by_expand(x, sh, sw)
    return F.interpolate(x, size=size, mode="nearest")


class Upsample(nn.Upsample):
    """nn.Upsample (the configs' `nn.Upsample`) with nearest integer-factor upsampling through `upsample_nearest`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scale_factor
        if self.mode == "nearest" and isinstance(s, (int, float)) and s == int(s) and _gpu_training(x):
            return _nearest_by_expand(x, int(s), int(s))
        return super().forward(x)  # exports keep the scale-factor Resize


@contextlib.contextmanager
def raw_outputs(model: nn.Module):
    """Inside: the model's head returns its raw maps in eval mode too (BatchNorm still in eval)."""
    heads = [m for m in model.modules() if isinstance(m, Detect)]
    for h in heads:
        h.raw = True
    try:
        yield
    finally:
        for h in heads:
            h.raw = False


def in_compiled_trace() -> bool:
    """True while dynamo traces this code for torch.compile, where a building block takes its compiled form. Not
    torch.compiler.is_compiling(): that flag is process-wide, true in every thread while any thread compiles (the
    loss compiled in the background), and eager code would take the compiled form then."""
    return torch.compiler.is_dynamo_compiling()


def avg_pool_2x2_s1(x: torch.Tensor) -> torch.Tensor:
    """The 2x2, stride-1 average pool of AConv and ADown; training on a GPU takes the shifted-sum form, inference
    and the CPU the pooling operator (the same values to rounding; exports keep one AveragePool node)."""
    if _gpu_training(x):
        # compiled (torch.compile), the sums go in as plain ops: autograd derives their backward and inductor fuses
        # it; the custom Function there gave zero gradients upstream on the GPU (docs/benchmarks.md, sixteenth session)
        return _shift_avg_pool_2x2(x) if in_compiled_trace() else _ShiftAvgPool2x2.apply(x)
    return F.avg_pool2d(x, 2, 1, 0, ceil_mode=False, count_include_pad=True)


class AConv(nn.Module):
    def __init__(self, c1: int, c2: int):
        super().__init__()
        self.cv1 = Conv(c1, c2, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv1(avg_pool_2x2_s1(x))


class ADown(nn.Module):
    def __init__(self, c1: int, c2: int):
        super().__init__()
        self.c = c2 // 2
        self.cv1 = Conv(c1 // 2, self.c, 3, 2, 1)
        self.cv2 = Conv(c1 // 2, self.c, 1, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = avg_pool_2x2_s1(x).chunk(2, 1)
        return torch.cat((self.cv1(x1), self.cv2(F.max_pool2d(x2, 3, 2, 1))), 1)


class RepNBottleneck(nn.Module):
    def __init__(self, c1: int, c2: int, shortcut: bool = True, g: int = 1, e: float = 0.5):
        super().__init__()
        c_ = int(c2 * e)
        self.cv1 = RepConvN(c1, c_, 3, 1)
        self.cv2 = Conv(c_, c2, 3, 1, g=g)
        self.add = shortcut and c1 == c2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class RepNCSP(nn.Module):
    def __init__(self, c1: int, c2: int, n: int = 1):
        super().__init__()
        c_ = int(c2 * 0.5)
        self.cv1 = Conv(c1, c_, 1, 1)
        self.cv2 = Conv(c1, c_, 1, 1)
        self.cv3 = Conv(2 * c_, c2, 1)
        self.m = nn.Sequential(*(RepNBottleneck(c_, c_, e=1.0) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class _ELAN(nn.Module):
    """Split cv1's output in two, chain cv2 and cv3 on the second half, concatenate all four, fuse with cv4."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        y.append(self.cv2(y[-1]))
        y.append(self.cv3(y[-1]))
        return self.cv4(torch.cat(y, 1))


class RepNCSPELAN4(_ELAN):
    def __init__(self, c1: int, c2: int, c3: int, c4: int, c5: int = 1):
        super().__init__()
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2 = nn.Sequential(RepNCSP(c3 // 2, c4, c5), Conv(c4, c4, 3, 1))
        self.cv3 = nn.Sequential(RepNCSP(c4, c4, c5), Conv(c4, c4, 3, 1))
        self.cv4 = Conv(c3 + 2 * c4, c2, 1, 1)


class ELAN1(_ELAN):
    def __init__(self, c1: int, c2: int, c3: int, c4: int):
        super().__init__()
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2 = Conv(c3 // 2, c4, 3, 1)
        self.cv3 = Conv(c4, c4, 3, 1)
        self.cv4 = Conv(c3 + 2 * c4, c2, 1, 1)


def max_pool_same(x: torch.Tensor, k: int) -> torch.Tensor:
    """max_pool2d(x, k, 1, k // 2) as the max of k shifted slices along the width, then k along the height: the
    same values. Compiled for training, inductor makes this a few memory-bound kernels, where its max_pool2d
    lowering (which keeps each window's argmax for the backward) runs slower than eager (docs/benchmarks.md). At a
    tie the gradient is shared between the equal inputs instead of going to the first."""
    p, h, w = k // 2, x.shape[-2], x.shape[-1]
    padded = F.pad(x, (p, p, p, p), value=float("-inf"))
    rows = padded[..., :w]
    for i in range(1, k):
        rows = torch.maximum(rows, padded[..., i : i + w])
    out = rows[..., :h, :]
    for i in range(1, k):
        out = torch.maximum(out, rows[..., i : i + h, :])
    return out


class SP(nn.Module):
    def __init__(self, k: int = 3, s: int = 1):
        super().__init__()
        self.m = nn.MaxPool2d(kernel_size=k, stride=s, padding=k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.m.stride == 1 and in_compiled_trace():
            return max_pool_same(x, self.m.kernel_size)
        return self.m(x)


class SPPELAN(nn.Module):
    def __init__(self, c1: int, c2: int, c3: int):
        super().__init__()
        self.cv1 = Conv(c1, c3, 1, 1)
        self.cv2, self.cv3, self.cv4 = SP(5), SP(5), SP(5)
        self.cv5 = Conv(4 * c3, c2, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for m in (self.cv2, self.cv3, self.cv4):
            y.append(m(y[-1]))
        return self.cv5(torch.cat(y, 1))


class Concat(nn.Module):
    def __init__(self, dimension: int = 1):
        super().__init__()
        self.d = dimension

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(x, self.d)


class Silence(nn.Module):
    """Identity placeholder that keeps layer indices aligned with the official configs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class CBLinear(nn.Module):
    def __init__(self, c1: int, c2s: list[int], k: int = 1, s: int = 1):
        super().__init__()
        self.c2s = list(c2s)
        self.conv = nn.Conv2d(c1, sum(c2s), k, s, autopad(k), bias=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.conv(x).split(self.c2s, dim=1)


class CBFuse(nn.Module):
    def __init__(self, idx: list[int]):
        super().__init__()
        self.idx = list(idx)

    def forward(self, xs: list) -> torch.Tensor:
        size = xs[-1].shape[2:]
        out = xs[-1]
        for i, x in enumerate(xs[:-1]):
            out = out + upsample_nearest(x[self.idx[i]], size)
        return out


class DFL(nn.Module):
    """Expectation over `c1` distance bins; the fixed 1x1 conv is kept as a (frozen) parameter, as officially."""

    def __init__(self, c1: int = 16):
        super().__init__()
        self.c1 = c1
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.arange(c1, dtype=torch.float).view(1, c1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


def make_divisible(x: float, divisor: int) -> int:
    return int(math.ceil(x / divisor) * divisor)


class Detect(nn.Module):
    """Anchor-free decoupled head with one or more groups of inputs.

    One group is GELAN's single head; two groups are YOLOv9's auxiliary (first) and main (last) heads. Group g
    owns `cv{2+2g}` (box branches), `cv{3+2g}` (class branches) and `dfl` / `dfl{g+1}`, the official names.
    Training mode returns the raw maps (a list of levels, or a list of such lists for several groups); eval mode
    returns decoded (batch, 4 + nc, anchors) tensors with xywh boxes in input pixels and sigmoid scores, or the raw
    maps too inside `raw_outputs(model)` (validation computes its loss from them and decodes them with `decode_all`).
    """

    raw = False

    def __init__(self, nc: int, ch: list[int], nl: int = 3, reg_max: int = 16):
        super().__init__()
        self.nc, self.nl, self.reg_max = nc, nl, reg_max
        self.no = nc + 4 * reg_max
        self.groups = len(ch) // nl
        self.register_buffer("stride", torch.zeros(nl), persistent=False)
        for g in range(self.groups):
            cin = ch[g * nl : (g + 1) * nl]
            c_box = make_divisible(max(cin[0] // 4, 4 * reg_max, 16), 4)
            c_cls = max(cin[0], min(nc * 2, 128))
            box = nn.ModuleList(
                nn.Sequential(Conv(x, c_box, 3), Conv(c_box, c_box, 3, g=4), nn.Conv2d(c_box, 4 * reg_max, 1, groups=4))
                for x in cin
            )
            cls = nn.ModuleList(
                nn.Sequential(Conv(x, c_cls, 3), Conv(c_cls, c_cls, 3), nn.Conv2d(c_cls, nc, 1)) for x in cin
            )
            setattr(self, f"cv{2 + 2 * g}", box)
            setattr(self, f"cv{3 + 2 * g}", cls)
            setattr(self, "dfl" if g == 0 else f"dfl{g + 1}", DFL(reg_max))

    def branches(self, g: int) -> tuple[nn.ModuleList, nn.ModuleList, DFL]:
        return (
            getattr(self, f"cv{2 + 2 * g}"),
            getattr(self, f"cv{3 + 2 * g}"),
            getattr(self, "dfl" if g == 0 else f"dfl{g + 1}"),
        )

    def bias_init(self) -> None:
        """Box bias 1.0; class bias for about 5 objects per 640 image over nc classes (official recipe)."""
        for g in range(self.groups):
            box, cls, _ = self.branches(g)
            for a, b, s in zip(box, cls, self.stride.tolist()):
                nn.init.constant_(a[-1].bias, 1.0)
                nn.init.constant_(b[-1].bias, math.log(5 / self.nc / (640 / s) ** 2))

    def forward(self, x: list[torch.Tensor]):
        raw = []
        for g in range(self.groups):
            box, cls, _ = self.branches(g)
            feats = x[g * self.nl : (g + 1) * self.nl]
            raw.append([torch.cat((box[i](f), cls[i](f)), 1) for i, f in enumerate(feats)])
        raw = raw[0] if self.groups == 1 else raw
        return raw if self.training or self.raw else self.decode_all(raw)

    def decode_all(self, raw) -> torch.Tensor | list[torch.Tensor]:
        """Raw maps (as training mode returns them) -> what eval mode returns."""
        groups = [raw] if self.groups == 1 else raw
        out = [self.decode(r, self.branches(g)[2]) for g, r in enumerate(groups)]
        return out[0] if self.groups == 1 else out

    def decode(self, feats: list[torch.Tensor], dfl: DFL) -> torch.Tensor:
        anchors, strides = make_anchors(feats, self.stride, 0.5)
        box, cls = torch.cat([f.flatten(2) for f in feats], 2).split((4 * self.reg_max, self.nc), 1)
        dbox = dist2bbox(dfl(box), anchors.transpose(0, 1).unsqueeze(0), xywh=True, dim=1) * strides.transpose(0, 1)
        return torch.cat((dbox, cls.sigmoid()), 1)


MODULES: dict[str, type[nn.Module]] = {
    "Conv": Conv,
    "AConv": AConv,
    "ADown": ADown,
    "RepNCSPELAN4": RepNCSPELAN4,
    "ELAN1": ELAN1,
    "SPPELAN": SPPELAN,
    "Concat": Concat,
    "Silence": Silence,
    "CBLinear": CBLinear,
    "CBFuse": CBFuse,
    "nn.Upsample": Upsample,
    "Detect": Detect,
    "DDetect": Detect,
    "DualDDetect": Detect,
}
