"""Warming the GPU while the images load: one whole training step (forward, loss, backward, optimizer step) of a
copy of the model on a synthetic batch of the run's shape, run by the training thread while another thread checks
and caches the images. A process's first step pays once for cuDNN timing every convolution's algorithms (forward
and both backwards), loading each kernel and initialising the libraries; that is per shape and thread, not per
model instance, so the real first step finds it done. The copy keeps the run's model, BatchNorm statistics,
gradients and random streams untouched."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch
from torch import nn

from yolov9.core.device import synchronized_time
from yolov9.train.config import LossGains
from yolov9.train.data.targets import pad_rows, target_capacity
from yolov9.train.ema import ModelEMA
from yolov9.train.gil import switch_interval
from yolov9.train.loss import DetectionLoss
from yolov9.train.step import StepOptions, build_optimizer, forward_backward, make_scaler, optimizer_step

BOXES = 8  # synthetic boxes per image, padded to the target capacity as the captured step pads a real batch


def synthetic_batch(
    batch: int, img: int, nc: int, seed: int = 0, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (batch, 3, img, img) on `device` and target rows (target_capacity(batch * BOXES), 6) on the CPU
    of image, class, x, y, w, h (normalised; BOXES per image, then all-zero rows), from private generators (the
    run's random streams do not move). The images are drawn where they are used: the CPU's draw of a large batch
    would sit on the warm-up's path."""
    imgs = torch.randint(
        0,
        256,
        (batch, 3, img, img),
        dtype=torch.uint8,
        device=device,
        generator=torch.Generator(device).manual_seed(seed),
    )
    g = torch.Generator().manual_seed(seed)
    n = batch * BOXES
    image = torch.arange(batch).repeat_interleave(BOXES).unsqueeze(1).float()
    cls = torch.randint(0, nc, (n, 1), generator=g).float()
    xy = 0.2 + 0.6 * torch.rand(n, 2, generator=g)
    wh = 0.05 + 0.3 * torch.rand(n, 2, generator=g)
    return imgs, pad_rows(torch.cat((image, cls, xy, wh), 1), target_capacity(n))


def _step_on_a_copy(
    model: nn.Module,
    batch: int,
    img: int,
    opts: StepOptions,
    gains: LossGains | None,
    then: Callable[[], None],
    lap: Callable[[str], None],
) -> None:
    """The warm-up's step; its tensors are this function's, so they are freed when it returns or raises."""
    device = next(model.parameters()).device
    twin = copy.deepcopy(model).train()
    loss_fn = DetectionLoss.for_model(twin, gains)
    imgs, targets = synthetic_batch(batch, img, loss_fn.nc, device=device)
    scaler = make_scaler(device, opts.amp_dtype)
    lap("copy")
    then()
    forward_backward(twin, imgs, targets, loss_fn, scaler, opts)
    lap("forward_backward")
    # built after the forward and backward: an optimizer's first use imports torch._dynamo (seconds), which the
    # trainer's data thread imports meanwhile (with torchvision) while cuDNN times the convolutions
    optimizer = build_optimizer(twin, "SGD", 0.01, 0.9, 5e-4)
    optimizer_step(twin, optimizer, scaler, ModelEMA(twin), opts.clip)
    lap("optimizer")


def prewarm(
    model: nn.Module,
    batch: int,
    img: int,
    opts: StepOptions,
    gains: LossGains | None = None,
    then: Callable[[], None] = lambda: None,
) -> tuple[dict[str, float], str | None]:
    """One whole training step of a copy of `model` on a synthetic (batch, 3, img, img) batch, on the calling
    thread: the thread that will train, because PyTorch keeps cuDNN's timed choices per thread (the backward's run
    on autograd's device thread, shared by all). Returns the seconds of each part (the copy and its batch, the
    forward and backward, the optimizer and its step, the release of the copy's memory; each waits for the GPU)
    and, when it failed (e.g. out of memory at a large batch), why in one line: a failure costs only the warm-up,
    the first step then warms up as it would have. `then` is called once the copy is made (not if that failed):
    the trainer starts its data thread there, because the copy is interpreter work that the thread's imports would
    share the interpreter lock with, and the forward and backward that follow mostly wait for the GPU and cuDNN
    (with a short switch interval, so that this thread wins the lock back quickly after each operation)."""
    device = next(model.parameters()).device
    parts: dict[str, float] = {}
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = synchronized_time(device)
        parts[name] = round(now - t, 3)
        t = now

    error = None
    try:
        with switch_interval():  # the data thread imports and caches meanwhile
            _step_on_a_copy(model, batch, img, opts, gains, then, lap)
    except Exception as e:  # noqa: BLE001 (the warm-up is an optimisation: the run goes on without it)
        error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the copy's cached activations would sit beside the real step's
    lap("release")
    return parts, error
