"""CUDA-graph replay around any CUDA engine, one graph per input shape (the serving detector's batch buckets)."""

from __future__ import annotations

from collections.abc import Callable

import torch

Outputs = torch.Tensor | tuple[torch.Tensor, ...]


class CudaGraphEngine:
    """Wraps a CUDA engine (or any call of tensors to a tensor or a tuple of them with fixed shapes) and replays one
    captured CUDA graph per input shapes and dtypes: a batch-1 call then costs one graph launch instead of hundreds
    of kernel launches (the launch-bound regime). Inputs may be on the host; they are copied into the graph's own.

    clone=False returns the graph's own output tensors: no copy, but they hold the next call's results once it has
    run, so a caller must be done with them (or have copied them) before calling again."""

    def __init__(self, engine: Callable[..., Outputs], clone: bool = True):
        self.inner, self.clone = engine, clone
        self.kind = engine.kind + "-graph"
        self.names, self.img_size, self.device, self.dtype = engine.names, engine.img_size, engine.device, engine.dtype
        self.graphs: dict[tuple, tuple] = {}
        # one memory pool for all shapes: replays never overlap and each output is copied out right after its
        # replay, so graphs may reuse each other's intermediate memory (11 batch buckets cost about one)
        self.pool = torch.cuda.graph_pool_handle() if torch.cuda.is_available() else None

    @torch.inference_mode()
    def __call__(self, *xs: torch.Tensor) -> Outputs:
        key = tuple((tuple(x.shape), x.dtype) for x in xs)
        if key not in self.graphs:
            self.graphs[key] = self._capture(xs)
        graph, static_in, static_out = self.graphs[key]
        for s, x in zip(static_in, xs):
            s.copy_(x, non_blocking=True)
        graph.replay()
        if not self.clone:
            return static_out
        return static_out.clone() if isinstance(static_out, torch.Tensor) else tuple(t.clone() for t in static_out)

    def _capture(self, xs: tuple[torch.Tensor, ...]) -> tuple:
        static_in = [x.to(self.device, copy=True) for x in xs]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm up allocations and autotuning outside the capture
                self.inner(*static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = self.inner(*static_in)
        return graph, static_in, static_out
