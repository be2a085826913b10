"""The training step, shared by the trainer, `bench train` and `--batch -1`, so what is timed is what trains: the
device, the optimizer's parameter groups, one micro-batch forward/backward and one optimizer step."""

from __future__ import annotations

import torch
from torch import nn

from core.preprocess import to_input
from train.ema import ModelEMA
from train.loss import DetectionLoss

AMP_DTYPES: dict[str, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}


def select_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.isdigit():
        if not torch.cuda.is_available():
            raise RuntimeError(f"--device {spec}: no CUDA GPU on this machine (use --device cpu)")
        return torch.device(f"cuda:{spec}")
    return torch.device(spec)


def amp_dtype(mode: str, device: torch.device) -> torch.dtype | None:
    if mode not in AMP_DTYPES:
        raise ValueError(f"--amp {mode}: choose {', '.join(AMP_DTYPES)}")
    if device.type == "cpu" and mode == "fp16":
        print("note: --amp fp16 is GPU-only; using bf16 autocast on the CPU")
        return torch.bfloat16
    return AMP_DTYPES[mode]


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
        opt = torch.optim.SGD(biases, lr=lr, momentum=momentum, nesterov=True)
    elif name == "AdamW":
        opt = torch.optim.AdamW(biases, lr=lr, betas=(momentum, 0.999), weight_decay=0.0)
    else:
        raise ValueError(f"--optimizer {name}: choose SGD or AdamW")
    opt.add_param_group({"params": weights, "weight_decay": decay})
    opt.add_param_group({"params": norms, "weight_decay": 0.0})
    return opt


def forward_backward(
    model: nn.Module,
    imgs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: DetectionLoss,
    amp_dtype: torch.dtype | None,
    scaler: torch.amp.GradScaler,
    channels_last: bool = True,
    world: int = 1,
):
    """One micro-batch: uint8 images to the device, normalised there, autocast forward, fp32 loss, backward.
    Under DDP (world ranks) the loss is scaled by world: DDP averages gradients over ranks, and the official loss
    is a sum over the batch, so this keeps the gradient of one process with the global batch."""
    dev = next(model.parameters()).device
    x = imgs.to(dev, non_blocking=True)
    if channels_last and dev.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.autocast(dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
        preds = model(to_input(x))
    loss, items = loss_fn(preds, targets.to(dev, non_blocking=True), padded=True)
    scaler.scale(loss * world if world > 1 else loss).backward()
    return loss, items


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    ema: ModelEMA | None,
    clip: float,
    loss: torch.Tensor,
    finite: bool | None = None,
) -> bool:
    """Unscale, clip, step, EMA; False (nothing applied) for a non-finite loss. The finiteness check is the one
    host synchronisation of a training step (`finite` when the caller already decided it, across ranks)."""
    ok = bool(torch.isfinite(loss)) if finite is None else finite
    if ok:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
        scaler.step(optimizer)
        scaler.update()
        if ema is not None:
            ema.update(model)
    optimizer.zero_grad(set_to_none=True)
    return ok
