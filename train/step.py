"""The training step, shared by the trainer, `bench train` and `--batch -1`, so what is timed is what trains: the
device, the optimizer's parameter groups, one micro-batch forward/backward and one optimizer step.

No step waits for the host: a non-finite loss poisons the gradients, and the fused optimizer skips a step whose
gradients are not finite on the device (`found_inf`), so the host can queue the next step while this one runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from yolov9.core.device import cpu_has_bf16
from yolov9.core.errors import BadInput
from yolov9.core.preprocess import to_input
from yolov9.train.ema import ModelEMA
from yolov9.train.loss import DetectionLoss

AMP_DTYPES: dict[str, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}


def amp_dtype(mode: str, device: torch.device) -> torch.dtype | None:
    """--amp's dtype. auto: fp16 on a GPU (faster than bf16 for every model and batch measured, and stable with the
    gradient scaler, as in the official trainer); on a CPU bf16 where it has bf16 instructions, else fp32 (bf16
    autocast without them runs several times slower than fp32)."""
    if mode == "auto":
        mode = "fp16" if device.type == "cuda" else "bf16" if device.type == "cpu" and cpu_has_bf16() else "off"
    if mode not in AMP_DTYPES:
        raise BadInput(f"--amp {mode}: choose auto, {', '.join(AMP_DTYPES)}")
    if device.type == "cpu" and mode == "fp16":
        print("note: --amp fp16 is GPU-only; using bf16 autocast on the CPU")
        return torch.bfloat16
    return AMP_DTYPES[mode]


# The run length (training images: epochs x images) from which cuDNN's algorithm timing earns back its seconds at
# the start with its faster steps (docs/benchmarks.md)
AUTO_CUDNN_BENCHMARK_IMAGES = 40_000


def cudnn_benchmark(choice: bool | None, images: int) -> bool:
    """--cudnn-benchmark as chosen, or by default (None) on for a run of at least AUTO_CUDNN_BENCHMARK_IMAGES."""
    return choice if choice is not None else images >= AUTO_CUDNN_BENCHMARK_IMAGES


@contextlib.contextmanager
def heuristic_convolutions() -> Iterator[None]:
    """cuDNN picks convolution algorithms by its heuristics inside, without timing them: for validation during a
    run that times the training step's. Validation's shapes (twice the batch, the last short batch) would each be
    timed afresh, which made the first validation several times longer and its memory peak higher, while later
    validations ran no faster (docs/benchmarks.md)."""
    timing = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = timing


def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, decay: float):
    """Three groups as officially: biases (no decay), weights (decay), norm weights (no decay)."""
    biases, weights, norms = [], [], []
    for m in model.modules():
        if isinstance(getattr(m, "bias", None), nn.Parameter):
            biases.append(m.bias)
        if isinstance(m, nn.BatchNorm2d):
            norms.append(m.weight)
        elif isinstance(getattr(m, "weight", None), nn.Parameter) and m.weight.requires_grad:
            weights.append(m.weight)
    if name == "SGD":
        opt = torch.optim.SGD(biases, lr=lr, momentum=momentum, nesterov=True, fused=True)
    elif name == "AdamW":
        # capturable keeps the step count on the device: no host sync, and a CUDA graph may capture the step
        cuda = next(model.parameters()).is_cuda
        opt = torch.optim.AdamW(biases, lr=lr, betas=(momentum, 0.999), weight_decay=0.0, fused=True, capturable=cuda)
    else:
        raise BadInput(f"--optimizer {name}: choose SGD or AdamW")
    opt.add_param_group({"params": weights, "weight_decay": decay})
    opt.add_param_group({"params": norms, "weight_decay": 0.0})
    if name == "SGD":
        # fused SGD leaves a new momentum buffer uninitialised when its first step is skipped (found_inf);
        # zero buffers give the same first step (buffer = gradient) and a skipped one that changes nothing
        for p in biases + weights + norms:
            opt.state[p]["momentum_buffer"] = torch.zeros_like(p)
    return opt


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Resume an optimizer's state; one saved by an unfused optimizer would otherwise turn this one unfused."""
    optimizer.load_state_dict(state)
    for g in optimizer.param_groups:
        g["fused"], g["foreach"] = True, None


def make_scaler(device: torch.device, dtype: torch.dtype | None) -> torch.amp.GradScaler:
    """The gradient scaler fp16 needs; a disabled one otherwise (bf16 and fp32 have fp32's range)."""
    return torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)


@dataclass(frozen=True)
class StepOptions:
    """How the step runs: autocast dtype (None: fp32), channels-last input, ranks (DDP's gradient averaging is
    undone by scaling the loss), the clip norm, CUDA graphs (taken where one GPU allows them) and torch.compile
    (train/compiled.py: the loss alone, or the forward per layer or as one model, with the loss unless compile_loss
    is off; in the background with compile_background)."""

    amp_dtype: torch.dtype | None = None
    channels_last: bool = True
    world: int = 1
    clip: float = 10.0
    cuda_graph: bool = True
    compile: str = "off"
    compile_loss: bool = True
    # what compiles does so beside the first steps, which run uncompiled; one process only (under DDP the step
    # cannot take over a part compiled in the background: its forward is the wrapper's)
    compile_background: bool = False
    # this machine compiled the same forward and loss before (compiled.compiled_before): a background compile then
    # takes every graph from inductor's cache in the thread, with no second process to fill it first
    compile_cached: bool = False


def autocast(device_type: str, dtype: torch.dtype | None, cache: bool = True) -> torch.autocast:
    """Autocast to dtype on that device type; None runs in fp32 (autocast off)."""
    return torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None, cache_enabled=cache)


def forward_backward(
    model: nn.Module,
    imgs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: DetectionLoss,
    scaler: torch.amp.GradScaler,
    opts: StepOptions = StepOptions(),
    autocast_cache: bool = True,
):
    """One micro-batch: uint8 images to the device, normalised there, autocast forward, fp32 loss, backward.
    Under DDP (opts.world ranks) the loss is scaled by world: DDP averages gradients over ranks, and the official
    loss is a sum over the batch, so this keeps the gradient of one process with the global batch. A CUDA graph
    capture needs autocast_cache=False (autocast's cache of cast weights cannot outlive the capture)."""
    amp_dtype, channels_last, world = opts.amp_dtype, opts.channels_last, opts.world
    dev = next(model.parameters()).device
    x = imgs.to(dev, non_blocking=True)
    if channels_last and dev.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    with autocast(dev.type, amp_dtype, autocast_cache):
        preds = model(to_input(x))
    loss, items = loss_fn(preds, targets.to(dev, non_blocking=True))
    # NaN times a non-finite loss makes every gradient NaN (on every rank, after DDP's all-reduce): the step skips
    # on the device instead of the host testing the loss
    factor = torch.where(torch.isfinite(loss), float(world), torch.nan)
    scaler.scale(loss * factor).backward()
    return loss.detach(), items  # detached: a kept autograd graph would tie the next backward to this one


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    ema: ModelEMA | None,
    clip: float,
    keep_grads: bool = False,
) -> torch.Tensor:
    """Unscale, clip, step, EMA, all queued on the device. Returns a 0-d tensor, 1.0 when the step was skipped for
    non-finite gradients (the parameters and optimizer state are then unchanged; the EMA updates, as officially).
    keep_grads zeroes the gradients in place (a captured backward accumulates into them) instead of dropping them."""
    if not all(g.get("fused") for g in optimizer.param_groups):
        raise ValueError("optimizer_step needs a fused optimizer (build_optimizer): it skips steps on the device")
    if scaler.is_enabled():
        scaler.unscale_(optimizer)
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
    found_inf = (~torch.isfinite(norm)).float()
    if scaler.is_enabled():
        scaler.step(optimizer)  # hands the fused step its own found_inf, the same test
        scaler.update()
    else:
        optimizer.found_inf = found_inf  # read by the fused kernels, as GradScaler.step would set it
        optimizer.step()
        del optimizer.found_inf
    if ema is not None:
        ema.update(model)
    optimizer.zero_grad(set_to_none=not keep_grads)
    return found_inf
