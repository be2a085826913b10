"""GPU utilisation and memory for progress bars and benchmarks, read through NVML (nvidia-ml-py)."""

from __future__ import annotations

import torch


class GpuMonitor:
    def __init__(self, device: torch.device):
        self.device, self.handle = device, None
        if device.type == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nvml = pynvml
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            except Exception:  # NVML missing or unsupported: fall back to torch's memory counters only
                self.handle = None

    def utilization(self) -> int | None:
        if self.handle is None:
            return None
        return int(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)

    def used_gib(self) -> float | None:
        """Device memory in use by every process, CUDA contexts included (what nvidia-smi reports)."""
        if self.handle is None:
            return None
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used / 2**30

    def peak_gib(self) -> float:
        """Peak memory torch's caching allocator reserved (its share of what nvidia-smi shows)."""
        if self.device.type != "cuda":
            return 0.0
        return torch.cuda.max_memory_reserved(self.device) / 2**30

    def allocations(self) -> dict:
        """What this process has asked CUDA for so far ({} on the CPU): the caching allocator's device segments (its
        cudaMalloc calls) and the pinned host blocks of the loader's pinning thread, with the seconds their
        allocation took; both run beside the training step and can stall it."""
        if self.device.type != "cuda":
            return {}
        out = {"device_segments": torch.cuda.memory_stats(self.device).get("segment.all.allocated", 0)}
        host = getattr(torch.cuda, "host_memory_stats", dict)()  # torch 2.7 and later
        if host:
            out["pinned_blocks"] = host.get("num_host_alloc", 0)
            out["pinned_gib"] = round(host.get("allocated_bytes.peak", 0) / 2**30, 2)
            out["pinned_alloc_s"] = round(host.get("host_alloc_time.total", 0) / 1e6, 3)  # microseconds
        return out

    def read(self) -> str:
        if self.device.type != "cuda":
            return "cpu"
        util = self.utilization()
        return f"gpu {util if util is not None else '?'}% {torch.cuda.memory_reserved(self.device) / 2**30:.1f}G"
