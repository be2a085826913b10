"""A micro-batch's forward, loss and backward captured once as a CUDA graph and replayed for every later batch of
the same shape: one launch instead of thousands, for the small batches whose step is bound by the host launching
kernels. The unscale, clip, optimizer step and EMA stay eager: fused and foreach kernels, a few launches each.

Gradients are static tensors that the captured backward accumulates into, so the optimizer must zero them in place
(`optimizer_step(..., keep_grads=True)`) instead of dropping them."""

from __future__ import annotations

import torch
from torch import nn

from train.loss import DetectionLoss
from train.step import forward_backward


class GraphedStep:
    """Call with a pinned uint8 batch (b, 3, h, w) and padded targets (b, n, 5); returns (loss, items) like
    `forward_backward`. The first `warmup` calls of a shape run eagerly on a side stream (cuDNN picks its kernels,
    the loss caches its constants), the next captures and replays; a batch of another shape runs eagerly, and one
    with more boxes than the captured target buffer holds captures again with room for it."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: DetectionLoss,
        amp_dtype: torch.dtype | None,
        scaler: torch.amp.GradScaler,
        channels_last: bool = True,
        warmup: int = 3,
    ):
        self.model, self.loss_fn, self.amp_dtype, self.scaler = model, loss_fn, amp_dtype, scaler
        self.channels_last, self.warmup = channels_last, warmup
        self.device = next(model.parameters()).device
        # under torchrun the step runs through DDP, whose all-reduce hooks a capture does not take
        if self.device.type != "cuda" or torch.distributed.is_initialized():
            raise ValueError("--cuda-graph needs one CUDA GPU (not the CPU, not a multi-GPU run)")
        self.graph: torch.cuda.CUDAGraph | None = None
        self.imgs: torch.Tensor | None = None
        self.targets: torch.Tensor | None = None
        self.out: tuple[torch.Tensor, torch.Tensor] | None = None
        self.eager_calls = 0  # of the captured shape, before the capture
        self.captures = 0

    def __call__(self, imgs: torch.Tensor, targets: torch.Tensor):
        if self.imgs is not None and imgs.shape != self.imgs.shape:
            return self._eager(imgs, targets)  # e.g. an epoch's short last batch
        n = targets.shape[1]
        if self.targets is None or n > self.targets.shape[1]:
            self._buffers(imgs, max(64, 1 << (n - 1).bit_length()))
        self.imgs.copy_(imgs, non_blocking=True)
        self.targets.zero_()
        self.targets[:, :n].copy_(targets, non_blocking=True)
        if self.graph is None:
            if self.eager_calls < self.warmup:
                self.eager_calls += 1
                return self._side_stream()
            self._capture()
        self.graph.replay()
        return self.out

    def _buffers(self, imgs: torch.Tensor, capacity: int) -> None:
        """(Re)allocate the static inputs; a graph captured on the old ones is dropped."""
        self.imgs = torch.empty(imgs.shape, dtype=imgs.dtype, device=self.device)
        self.targets = torch.zeros(imgs.shape[0], capacity, 5, device=self.device)
        self.graph, self.out = None, None

    def _step(self):
        return self._eager(self.imgs, self.targets, autocast_cache=False)

    def _side_stream(self):
        """An eager step on a side stream, as capture requires of the steps before it."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            out = self._step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        return out

    def _capture(self) -> None:
        # gradients must exist before the capture so that the captured backward accumulates into them
        for p in self.model.parameters():
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.out = self._step()
        self.graph = graph
        self.captures += 1

    def _eager(self, imgs: torch.Tensor, targets: torch.Tensor, autocast_cache: bool = True):
        return forward_backward(
            self.model,
            imgs,
            targets,
            self.loss_fn,
            self.amp_dtype,
            self.scaler,
            self.channels_last,
            autocast_cache=autocast_cache,
        )
