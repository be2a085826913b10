"""The epoch loop, as torchvision's references/detection/engine.py has it: `train_one_epoch` runs one epoch of
micro-batches with warm-up and nominal-batch accumulation through a `TrainStep` (captured or eager), and returns
the epoch's log row."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from yolov9.core.device import synchronized_time
from yolov9.train import distributed
from yolov9.train.compiled import BackgroundCompile, compiled, compiled_loss
from yolov9.train.config import Hyp
from yolov9.train.data.dataset import Batch
from yolov9.train.distributed import DistContext
from yolov9.train.gpu_monitor import GpuMonitor
from yolov9.train.graphed_step import GraphedOptimizerStep, GraphedStep, graphs_possible
from yolov9.train.stall import watched
from yolov9.train.state import TrainState
from yolov9.train.step import StepOptions, forward_backward, optimizer_step


class TrainStep:
    """One micro-batch (`micro`) and one optimizer step (`step`), captured or eager: what the trainer, `bench
    train` and their tests run. `net` is what the forward runs (`step_module`: the model, compiled or not, or its
    DDP wrapper); the loss is compiled as opts say. Accumulation micro-batches of a DDP run skip the gradient
    all-reduce (`sync=False`)."""

    def __init__(self, model: nn.Module, net: nn.Module, loss_fn, optimizer, scaler, ema, opts: StepOptions):
        self.model, self.net, self.optimizer = model, net, optimizer
        self.loss_fn = compiled_loss(
            loss_fn, opts.compile, opts.compile_loss, opts.compile_background, opts.compile_cached
        )
        self.scaler, self.ema, self.opts = scaler, ema, opts
        self.graphs = opts.cuda_graph and graphs_possible(next(model.parameters()).device)
        self.reset()

    def reset(self) -> None:
        """Drop captured graphs (after the gradients were dropped, e.g. when the batch was halved)."""
        self.graphed, self.graphed_opt = None, None
        if self.graphs:
            o = self.opts
            self.graphed = GraphedStep(self.net, self.loss_fn, self.scaler, o)
            self.graphed_opt = GraphedOptimizerStep(self.model, self.optimizer, self.scaler, self.ema, o.clip)

    @property
    def captures(self) -> int:
        return self.graphed.captures + self.graphed_opt.captures if self.graphs else 0

    @property
    def background(self) -> list[BackgroundCompile]:
        """The parts compiling (or compiled) in a background thread: the forward, the loss."""
        return [p for p in (self.net, self.loss_fn) if isinstance(p, BackgroundCompile) and p.background]

    def micro(self, imgs: torch.Tensor, targets: torch.Tensor, sync: bool = True):
        background = self.background
        for part in background:  # a finished background compile takes over here, between steps
            part.take_over()
        if self.graphed is not None:
            out = self.graphed(imgs, targets)
        else:
            ddp_local = isinstance(self.net, nn.parallel.DistributedDataParallel) and not sync
            with self.net.no_sync() if ddp_local else contextlib.nullcontext():
                out = forward_backward(self.net, imgs, targets, self.loss_fn, self.scaler, self.opts)
        self._start_background()
        return out

    def step(self) -> torch.Tensor:
        if self.graphed_opt is not None:
            out = self.graphed_opt()
            self._start_background()
            return out
        return optimizer_step(self.model, self.optimizer, self.scaler, self.ema, self.opts.clip)

    def close(self) -> None:
        """Stop what still compiles for this step in a second process (the run ends)."""
        for part in self.background:
            part.stop()

    def _start_background(self) -> None:
        """Start the background compiles once the uncompiled step runs at full speed: once its micro-batch and its
        optimizer step are captured (or known to run eagerly). A capture waits for a running compile, so an
        optimizer step not yet captured (the warm-up's momentum ramp) would run eagerly for the whole compile."""
        g, o = self.graphed, self.graphed_opt
        if (g is None or g.graph is not None or g.eager_only) and (o is None or o.graph is not None):
            for part in self.background:  # one at a time: each holds COMPILE_LOCK while it compiles
                part.start_background()


def step_module(model: nn.Module, opts: StepOptions, ctx: DistContext) -> nn.Module:
    """What the step's forward runs: the model, compiled when opts.compile says so, DDP-wrapped under torchrun."""
    net = compiled(model, opts.compile, opts.compile_background, opts.compile_cached)
    if ctx.active:
        dev = ctx.device
        net = nn.parallel.DistributedDataParallel(net, device_ids=[dev.index] if dev.type == "cuda" else None)
    return net


def accumulation_target(nbs: int, batch: int, override: int | None = None) -> float:
    """Micro-batches per optimizer step that make up the nominal batch (fractional: the warm-up ramps towards it)."""
    return float(override) if override else nbs / batch


def accumulation(nbs: int, batch: int, override: int | None = None) -> int:
    return max(round(accumulation_target(nbs, batch, override)), 1)


@dataclass
class EpochPlan:
    """What an epoch needs of the run: its length, the warm-up and the accumulation schedule."""

    epochs: int
    batches: int  # per epoch
    warmup_iters: int  # -1: no warm-up
    accumulate: float  # accumulation_target()
    hyp: Hyp
    lr_factor: Callable[[int], float]  # the LR schedule's factor at an epoch


def warmup_iterations(hyp: Hyp, batches: int) -> int:
    """The official warm-up length: warmup_epochs of batches, at least 100 iterations (-1: none)."""
    return max(round(hyp.warmup_epochs * batches), 100) if hyp.warmup_epochs > 0 else -1


def warmup(optimizer: torch.optim.Optimizer, ni: int, plan: EpochPlan, lr_scale: float) -> int:
    """The official warm-up at step ni: accumulation ramps from 1, the bias LR down from warmup_bias_lr and the
    other LRs up from 0 to their scheduled values, momentum up from warmup_momentum. Returns the accumulation."""
    xi, hyp = [0, plan.warmup_iters], plan.hyp
    for j, g in enumerate(optimizer.param_groups):
        # plain floats: numpy scalars would make the checkpoint unreadable with weights_only
        g["lr"] = float(np.interp(ni, xi, [hyp.warmup_bias_lr if j == 0 else 0.0, g["initial_lr"] * lr_scale]))
        if "momentum" in g:
            g["momentum"] = float(np.interp(ni, xi, [hyp.warmup_momentum, hyp.momentum]))
    return max(1, round(float(np.interp(ni, xi, [1, plan.accumulate]))))


def train_one_epoch(
    state: TrainState,
    step: TrainStep,
    batches: Iterator[Batch],
    plan: EpochPlan,
    epoch: int,
    dist: DistContext,
    monitor: GpuMonitor,
) -> dict:
    """`plan.batches` batches from the run's batch iterator; returns the epoch's log row (mean losses, rates)."""
    device = dist.device
    state.model.train()
    accumulate = max(round(plan.accumulate), 1)
    mloss = torch.zeros(3, device=device)
    state.optimizer.zero_grad(set_to_none=not step.graphs)  # a captured backward owns the gradients
    bad_losses = torch.zeros((), dtype=torch.int64, device=device)  # read once, after the epoch
    t_epoch, t_wait, seen, first = time.perf_counter(), 0.0, 0, {}
    bar = tqdm(total=plan.batches, desc=f"epoch {epoch + 1}/{plan.epochs}", dynamic_ncols=True, disable=not dist.main)
    with bar:
        for i in watched(range(plan.batches)):  # a stalled batch or step prints where each thread waits
            t0 = time.perf_counter()
            batch = next(batches)
            t_batch = time.perf_counter()
            t_wait += t_batch - t0
            ni = i + plan.batches * epoch
            if ni <= plan.warmup_iters:
                accumulate = warmup(state.optimizer, ni, plan, plan.lr_factor(epoch))
            optimize = ni - state.last_opt_step >= accumulate
            # gradients of accumulation steps stay local; the optimizer step's backward all-reduces them
            loss, items = step.micro(batch.images, batch.rows, sync=optimize)
            t_micro = time.perf_counter()
            bad_losses += ~torch.isfinite(loss)
            mloss = (mloss * i + torch.where(torch.isfinite(items), items, mloss)) / (i + 1)
            seen += batch.images.shape[0] * dist.world
            if optimize:
                state.skipped += step.step()
                state.last_opt_step = ni
            if i == 0:  # capture and compilation happen here: worth one synchronisation per epoch to see them
                first = _first_step(device, monitor, t_epoch, t_wait, t_micro - t_batch)
            if dist.main and (i % 10 == 0 or i == plan.batches - 1):
                el = time.perf_counter() - t_epoch
                b, c, dfl = mloss.tolist()
                bar.set_postfix_str(
                    f"box {b:.3f} cls {c:.3f} dfl {dfl:.3f} | {seen / el:.0f} img/s | "
                    f"data {100 * t_wait / el:.0f}% | {monitor.read()}"
                )
            bar.update(1)
    el = time.perf_counter() - t_epoch
    if int(bad_losses):
        tqdm.write(f"warning: {int(bad_losses)} non-finite losses in epoch {epoch + 1}; their steps were skipped")
    box, cls, dfl = distributed.mean(dist, mloss).tolist()
    return {
        "epoch": epoch,
        "box": box,
        "cls": cls,
        "dfl": dfl,
        **{f"lr{j}": g["lr"] for j, g in enumerate(state.optimizer.param_groups)},
        "images_per_s": seen / el,
        "data_wait": t_wait / el,
        **first,
    }


def _first_step(device: torch.device, monitor: GpuMonitor, t_epoch: float, t_wait: float, micro_s: float) -> dict:
    """The epoch's first step, once its optimizer step was launched: seconds from the epoch's start to its end, of
    which waiting for the batch and each part's host seconds (cuDNN's timing, capture and compilation block the
    host, kernels do not; the GPU's share is the wait at the end), and on a GPU what was allocated up to then."""
    t_launched = time.perf_counter()
    now = synchronized_time(device)
    row = {
        "first_step_s": now - t_epoch,
        "first_batch_s": t_wait,
        "first_step_parts_s": {
            "forward_backward": round(micro_s, 3),
            "optimizer": round(t_launched - t_epoch - t_wait - micro_s, 3),
            "gpu_wait": round(now - t_launched, 3),
        },
    }
    if allocations := monitor.allocations():
        row["first_step_allocations"] = allocations
    return row
