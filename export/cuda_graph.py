"""CUDA-graph replay around any CUDA engine, one graph per input shape (the serving detector's batch buckets)."""

from __future__ import annotations

import torch

from yolov9.export.engine import Engine


class CudaGraphEngine:
    """Wraps a CUDA engine and replays one captured CUDA graph per input shape: a batch-1 call then costs one
    graph launch instead of hundreds of kernel launches (the launch-bound regime)."""

    def __init__(self, engine: Engine):
        self.inner = engine
        self.kind = engine.kind + "-graph"
        self.names, self.img_size, self.device, self.dtype = engine.names, engine.img_size, engine.device, engine.dtype
        self.graphs: dict[tuple, tuple] = {}
        # one memory pool for all shapes: replays never overlap and each output is copied out right after its
        # replay, so graphs may reuse each other's intermediate memory (11 batch buckets cost about one)
        self.pool = torch.cuda.graph_pool_handle() if torch.cuda.is_available() else None

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        key = tuple(x.shape)
        if key not in self.graphs:
            static_in = torch.zeros(key, device=self.device, dtype=self.dtype)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # warm up allocations and autotuning outside the capture
                    self.inner(static_in)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                static_out = self.inner(static_in)
            self.graphs[key] = (graph, static_in, static_out)
        graph, static_in, static_out = self.graphs[key]
        static_in.copy_(x)
        graph.replay()
        return static_out.clone()
