"""The training step as CUDA graphs: a micro-batch's forward, loss and backward (`GraphedStep`) and the optimizer
step (`GraphedOptimizerStep`: unscale, clip, fused SGD/AdamW, scaler update, EMA, zeroing) are each captured once
and replayed, one launch instead of thousands, for the small batches whose step is bound by the host launching
kernels.

Gradients are static tensors that the captured backward accumulates into, so the optimizer must zero them in place
(`optimizer_step(..., keep_grads=True)`) instead of dropping them. Captures run in thread-local capture mode: the
data loader's pin-memory thread allocates and queries pinned host memory while the main thread captures, which
the default (global) mode counts as an error and which invalidates the capture."""

from __future__ import annotations

import torch
from torch import nn

from yolov9.train.compiled import COMPILE_LOCK
from yolov9.train.data.targets import target_capacity
from yolov9.train.ema import ModelEMA
from yolov9.train.loss import DetectionLoss
from yolov9.train.step import StepOptions, forward_backward, optimizer_step

CAPTURE_MODE = "thread_local"


def graphs_possible(device: torch.device) -> bool:
    """Captured steps need one CUDA GPU: under torchrun, DDP's gradient all-reduce runs in autograd hooks on its
    own streams and buckets, which a capture does not take, so multi-GPU runs stay eager."""
    return device.type == "cuda" and not torch.distributed.is_initialized()


class GraphedStep:
    """Call with a pinned uint8 batch (b, 3, h, w) and its target rows (n, 6); returns (loss, items) like
    `forward_backward`. The first `warmup` calls of a shape run eagerly on a side stream (cuDNN picks its kernels,
    the loss caches its constants), the next captures and replays; a batch of another shape runs eagerly, and one
    with more boxes than the captured target buffer holds warms up and captures again with room for it (a
    compiled loss meets the new box count in the warm-up, where any compile must happen: compiling inside a
    capture breaks it). While a background compile holds COMPILE_LOCK no capture can run: a batch with more boxes
    than the buffer then runs eagerly and the graph stays for the batches that fit."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: DetectionLoss,
        scaler: torch.amp.GradScaler,
        opts: StepOptions = StepOptions(),
        warmup: int = 3,
    ):
        self.model, self.loss_fn, self.scaler, self.opts, self.warmup = model, loss_fn, scaler, opts, warmup
        self.device = next(model.parameters()).device
        if not graphs_possible(self.device):
            raise ValueError("--cuda-graph needs one CUDA GPU (not the CPU, not a multi-GPU run)")
        self.graph: torch.cuda.CUDAGraph | None = None
        self.imgs: torch.Tensor | None = None
        self.targets: torch.Tensor | None = None
        self.out: tuple[torch.Tensor, torch.Tensor] | None = None
        self.eager_calls = 0  # of the captured shape, before the capture
        self.captures = 0
        self.side = torch.cuda.Stream(self.device)  # one stream for every warm-up step (autograd expects so)
        self.eager_only = False  # set when a capture ran out of memory
        self.versions = self._versions()  # a forward or loss compiled in the background changes them

    def __call__(self, imgs: torch.Tensor, targets: torch.Tensor):
        if self.eager_only or (self.imgs is not None and imgs.shape != self.imgs.shape):
            return self._eager(imgs, targets)  # e.g. an epoch's short last batch
        if self._versions() != self.versions:  # a compiled forward or loss is ready: warm up anew
            self.versions = self._versions()
            self._drop_graph()
        n = targets.shape[0]
        if self.targets is None or n > self.targets.shape[0]:
            if self.graph is not None and COMPILE_LOCK.locked():  # no capture until a background compile ends:
                return self._eager(imgs, targets)  # keep replaying the graph for the batches that fit
            self._buffers(imgs, target_capacity(n))
        self.imgs.copy_(imgs, non_blocking=True)
        self.targets.zero_()
        self.targets[:n].copy_(targets, non_blocking=True)
        if self.graph is None:
            if self.eager_calls < self.warmup:
                self.eager_calls += 1
                return self._side_stream()
            if not COMPILE_LOCK.acquire(blocking=False):  # a background compile runs: capture at a later step
                return self._side_stream()
            try:
                captured = self._capture()
            finally:
                COMPILE_LOCK.release()
            if not captured:
                return self._eager(imgs, targets)
        self.graph.replay()
        return self.out

    def _versions(self) -> tuple[int, int]:
        return getattr(self.model, "version", 0), getattr(self.loss_fn, "version", 0)

    def _buffers(self, imgs: torch.Tensor, capacity: int) -> None:
        """(Re)allocate the static inputs; a graph captured on the old ones is dropped and warms up anew."""
        self._drop_graph()
        self.imgs = torch.empty(imgs.shape, dtype=imgs.dtype, device=self.device)
        self.targets = torch.zeros(capacity, 6, device=self.device)

    def _drop_graph(self) -> None:
        """Forget the graph; the next calls warm up and capture anew. Its memory pool goes back to the driver at
        once: left to the allocator it is freed only when an allocation fails, so the new warm-up steps would first
        allocate their activations beside it (two steps' worth of GPU memory at a takeover or a larger buffer)."""
        dropped = self.graph is not None
        self.graph, self.out, self.eager_calls = None, None, 0
        if dropped:
            torch.cuda.empty_cache()

    def _step(self):
        return self._eager(self.imgs, self.targets, autocast_cache=False)

    def _side_stream(self):
        """An eager step on a side stream, as capture requires of the steps before it."""
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            out = self._step()
        torch.cuda.current_stream(self.device).wait_stream(self.side)
        return out

    def _capture(self) -> bool:
        """Capture the step; False (and eager from then on) when the graph does not fit in GPU memory."""
        # gradients must exist before the capture so that the captured backward accumulates into them
        for p in self.model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        # the warm-up steps' activations stay cached in the ordinary pool; released, the graph's own pool can take
        # that memory instead of holding a second copy beside it
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode=CAPTURE_MODE):
                self.out = self._step()
        except torch.OutOfMemoryError:
            del graph
            self.graph, self.out, self.eager_only = None, None, True
            torch.cuda.empty_cache()
            print("note: the captured training step does not fit in GPU memory at this batch; training eagerly")
            return False
        self.graph = graph
        self.captures += 1
        return True

    def _eager(self, imgs: torch.Tensor, targets: torch.Tensor, autocast_cache: bool = True):
        return forward_backward(self.model, imgs, targets, self.loss_fn, self.scaler, self.opts, autocast_cache)


class GraphedOptimizerStep:
    """`optimizer_step(..., keep_grads=True)` captured once and replayed. What the capture freezes is checked at
    every call: momentum, betas and weight decay (the warm-up ramps momentum, so warm-up steps run eagerly and the
    capture follows once they are constant); the learning rates live in device tensors refilled from the groups'
    floats when they change, so the LR schedule and the checkpointed optimizer state stay as they are eagerly. The
    scaler's scale and the EMA's update count are device tensors that the graph updates in place.

    Call like `optimizer_step`; returns the skipped-step flag, a static tensor that the next call overwrites."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scaler, ema: ModelEMA | None, clip: float):
        self.model, self.optimizer, self.scaler, self.ema, self.clip = model, optimizer, scaler, ema, clip
        self.device = next(model.parameters()).device
        if not graphs_possible(self.device):
            raise ValueError("--cuda-graph needs one CUDA GPU (not the CPU, not a multi-GPU run)")
        self.graph: torch.cuda.CUDAGraph | None = None
        self.frozen: tuple | None = None
        self.lrs = [torch.zeros((), device=self.device) for _ in optimizer.param_groups]
        self.lr_values: list[float | None] = [None] * len(self.lrs)
        self.out: torch.Tensor | None = None
        self.captures = 0

    def _hyper(self) -> tuple:
        return tuple((g.get("momentum"), g.get("betas"), g["weight_decay"]) for g in self.optimizer.param_groups)

    def __call__(self) -> torch.Tensor:
        hyper = self._hyper()
        if hyper != self.frozen:  # the warm-up's momentum ramp, or the first call: eager until it holds still
            self.frozen, self.graph = hyper, None
            return optimizer_step(self.model, self.optimizer, self.scaler, self.ema, self.clip, keep_grads=True)
        for i, g in enumerate(self.optimizer.param_groups):
            if g["lr"] != self.lr_values[i]:
                self.lrs[i].fill_(g["lr"])
                self.lr_values[i] = g["lr"]
        if self.graph is None:
            if not COMPILE_LOCK.acquire(blocking=False):  # a background compile runs: capture at a later step
                return optimizer_step(self.model, self.optimizer, self.scaler, self.ema, self.clip, keep_grads=True)
            try:
                self._capture()
            finally:
                COMPILE_LOCK.release()
        else:
            self.graph.replay()
        if self.ema is not None:
            self.ema.updates += 1  # the host's count; the graph advanced the device's
        return self.out

    def _capture(self) -> None:
        """Capturing runs the step once: its first replay is the capture itself."""
        floats = [g["lr"] for g in self.optimizer.param_groups]
        for g, t in zip(self.optimizer.param_groups, self.lrs):
            g["lr"] = t
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode=CAPTURE_MODE):
                self.out = optimizer_step(self.model, self.optimizer, self.scaler, self.ema, self.clip, keep_grads=True)
        finally:
            for g, f in zip(self.optimizer.param_groups, floats):
                g["lr"] = f
        if self.ema is not None:
            self.ema.updates -= 1  # counted again by __call__
        graph.replay()
        self.graph = graph
        self.captures += 1
