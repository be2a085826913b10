"""The cold half of a background compile, in a second process (`CacheFill`): dynamo's tracing, inductor's code
generation and its kernels' autotuning run there on a part rebuilt from a spec (`compiled.py`: the part's
`cache_spec()`), and leave their results in inductor's caches; the training process's thread then compiles the part
from those caches. In the training process the same cold work held the interpreter's lock for long stretches, and
the autotuning's `torch.cuda.synchronize()` waited behind the queued training steps; a second process has its own
lock and CUDA context, and runs at a lower priority than the training's loader and step (cache_fill_worker.py)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from yolov9.core.processes import ManagedProcess


class CacheFill(ManagedProcess):
    """One part compiled in a second process, started at construction. `wait()` returns None once it finished (its
    torch.compile counts in `report`), else why not in one line; `stop()` ends it and its compile workers."""

    stop_timeout = 5.0

    def __init__(self, spec: dict):
        super().__init__()
        self.report: dict | None = None
        self.stopped = False
        self._dir = Path(tempfile.mkdtemp(prefix="yolov9-compile-"))
        torch.save(spec, self._dir / "spec.pt")
        with open(self._dir / "log.txt", "wb") as log:
            cmd = [sys.executable, "-m", "yolov9.train.cache_fill_worker", str(self._dir / "spec.pt")]
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait(self) -> str | None:
        code = self.proc.wait()
        if self.stopped:  # its log may be gone already
            return "the compiling process was stopped"
        lines = [line.strip() for line in _read(self._dir / "log.txt").splitlines() if line.strip()]
        shutil.rmtree(self._dir, ignore_errors=True)
        if code == 0 and lines:
            with contextlib.suppress(ValueError):
                self.report = json.loads(lines[-1])
                return None
        if code < 0:
            return f"the compiling process was killed (signal {-code})"
        return lines[-1] if lines else f"the compiling process exited with code {code} and said nothing"

    def stop(self) -> None:
        self.stopped = True
        super().stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def tensor_meta(t: torch.Tensor) -> dict:
    """What a compile of `t`'s input sees (shape, strides, dtype), without its values."""
    return {"shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype).removeprefix("torch.")}


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def tensor_like(meta: dict, device: torch.device) -> torch.Tensor:
    """A tensor of `meta`'s shape, strides and dtype on `device`, with finite values."""
    t = torch.empty_strided(meta["shape"], meta["stride"], dtype=_dtype(meta["dtype"]), device=device)
    return t.uniform_() if t.is_floating_point() else t.zero_()


def compile_settings() -> dict:
    """The process-wide settings inductor's cache keys read besides the graph and its inputs (the thread count dynamo
    guards on, deterministic algorithms, the matmul precisions, the default dtype): the second process takes the
    training process's, or the thread's compile would miss the cache it filled."""
    matmul = torch.backends.cuda.matmul
    return {
        "threads": torch.get_num_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "fill_uninitialized_memory": torch.utils.deterministic.fill_uninitialized_memory,
        "matmul_fp32_precision": matmul.fp32_precision,
        "matmul_fp16_reduction": matmul.allow_fp16_reduced_precision_reduction,
        "matmul_bf16_reduction": matmul.allow_bf16_reduced_precision_reduction,
        "default_dtype": str(torch.get_default_dtype()).removeprefix("torch."),
    }


def apply_compile_settings(settings: dict) -> None:
    """Take `compile_settings()` of another process (in the second process, before it compiles)."""
    torch.set_num_threads(settings["threads"])
    torch.use_deterministic_algorithms(settings["deterministic"], warn_only=settings["deterministic_warn_only"])
    torch.utils.deterministic.fill_uninitialized_memory = settings["fill_uninitialized_memory"]
    matmul = torch.backends.cuda.matmul
    matmul.fp32_precision = settings["matmul_fp32_precision"]
    matmul.allow_fp16_reduced_precision_reduction = settings["matmul_fp16_reduction"]
    matmul.allow_bf16_reduced_precision_reduction = settings["matmul_bf16_reduction"]
    torch.set_default_dtype(_dtype(settings["default_dtype"]))
