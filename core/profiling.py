"""GPU time per kind of kernel under torch.profiler, for the benchmarks (`bench train --profile`, `bench engine
--profile`): where a step's or an engine call's GPU time goes."""

from __future__ import annotations

from collections.abc import Callable

import torch

KERNEL_KINDS = (  # by substrings of kernel names, first match wins (cuDNN's BatchNorm kernels before its convs;
    # nvjet: cuBLAS's GEMMs, which cuDNN runs for 1x1 convolutions)
    ("inductor", ("triton_",)),  # Inductor's generated kernels, named after the operators they fuse
    ("batchnorm", ("batch_norm", "batchnorm", "bn_fw", "bn_bw", "welford")),
    ("conv_gemm", ("conv", "gemm", "xmma", "cutlass", "implicit", "wgrad", "dgrad", "fprop", "cudnn", "nvjet")),
    ("optimizer", ("fused_sgd", "fused_adam", "multi_tensor", "foreach")),
    ("reduction", ("reduce", "norm_kernel", "topk", "sort", "scan")),
    ("layout_copy", ("copy", "transpose", "nchw", "nhwc", "cat_", "catarray", "gather", "scatter", "index")),
    ("elementwise", ("elementwise", "unrolled", "vectorized", "silu", "sigmoid")),
)


def _kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "other")


def profile_calls(step: Callable[[], object], n: int, dev: torch.device, out: str) -> dict:
    """n calls of `step` (a training step, an engine call) under torch.profiler: operator calls and kernel launches
    per call (host-bound calls show many of both), the share of GPU time per kind of kernel, and the top operators
    by host time and the top kernels by GPU time, as tables appended to `out`."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(n):
            step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    ka = prof.key_averages()
    kernels = [e for e in ka if e.device_type == DeviceType.CUDA]
    gpu_us = sum(e.self_device_time_total for e in kernels)
    shares: dict[str, float] = {}
    for e in kernels:
        kind = _kernel_kind(e.key)
        shares[kind] = shares.get(kind, 0.0) + e.self_device_time_total / max(gpu_us, 1e-9)
    with open(out, "a") as f:
        f.write(ka.table(sort_by="self_cpu_time_total", row_limit=30) + "\n")
        if kernels:
            f.write(ka.table(sort_by="self_device_time_total", row_limit=40) + "\n")
    return {
        "aten_ops_per_step": round(sum(e.count for e in ka if e.key.startswith("aten::")) / n),
        "kernel_launches_per_step": round(sum(e.count for e in ka if "LaunchKernel" in e.key) / n),
        "gpu_kernel_ms_per_step": round(gpu_us / n / 1e3, 2),
        "gpu_time_share": {k: round(v, 3) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])},
    }
