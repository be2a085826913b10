"""The one device choice of every command: 'auto' (a CUDA GPU when there is one), 'cpu', a CUDA index ('0') or a
torch device string ('cuda:1')."""

from __future__ import annotations

import time

import torch

from yolov9.core.errors import BadInput, Unavailable


def select_device(spec: str | torch.device | None) -> torch.device:
    if spec is None or str(spec) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec = str(spec)
    if spec.isdigit():
        spec = f"cuda:{spec}"
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise BadInput(f"--device {spec}: not a device (auto, cpu, a CUDA index such as 0, or cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise Unavailable(f"--device {spec}: no CUDA GPU on this machine (use --device cpu)")
    return dev


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 instructions (AVX512-BF16 or AMX), without which bf16 autocast is several times
    slower than fp32 (read from /proc/cpuinfo; other systems report none)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def synchronized_time(device: torch.device) -> float:
    """time.perf_counter() once the work queued on `device` has run: CUDA kernels run after their launch returns,
    so a clock read without waiting times only the launches."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def to_host(t: torch.Tensor, wait: str) -> torch.Tensor:
    """`t` in host memory. CUDA's default wait for a copy spins a core while the process holds fewer contexts than
    the machine has cores; with several serving processes beside their gateway that spinning takes the cores the
    rest of the stack needs. 'block' copies into pinned memory and sleeps on a blocking CUDA event until the copy
    is done (the thread wakes some microseconds later than a spinning one); 'spin' is the plain `.cpu()`."""
    if t.device.type != "cuda" or wait == "spin":
        return t.cpu()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    done = torch.cuda.Event(blocking=True)
    done.record(torch.cuda.current_stream(t.device))
    done.synchronize()
    return host
