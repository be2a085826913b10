"""A private CUDA MPS (Multi-Process Service) control daemon for the Triton server's model instances.

Each python-backend instance is its own process with its own CUDA context, and without MPS the GPU time-slices
between contexts, so more instances add little. Under MPS the instances' kernels share the GPU concurrently
(docs/benchmarks.md). The daemon gets its own pipe and log folders, so it
neither needs root nor meets another user's daemon; it is stopped with the server."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from yolov9.core.errors import Unavailable


class MpsError(Unavailable):
    pass


def find_control() -> str:
    """Path of nvidia-cuda-mps-control (installed with the NVIDIA driver utilities)."""
    path = shutil.which("nvidia-cuda-mps-control")
    if path is None:
        raise MpsError(
            "--mps needs nvidia-cuda-mps-control on PATH (NVIDIA driver utilities); "
            "it is not found here, so serve without --mps"
        )
    return path


class MpsDaemon:
    """Start with start(), hand `env` to the CUDA processes that should share the GPU, stop() when they exit."""

    def __init__(self, folder: str | Path | None = None):
        self.folder = Path(folder or tempfile.mkdtemp(prefix="yolov9-mps-"))
        self.pipe_dir, self.log_dir = self.folder / "pipe", self.folder / "log"
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}
        self.control: str | None = None

    def _run(self, *args: str, stdin: str | None = None, timeout: float = 15.0) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.control or find_control(), *args],
            input=stdin,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, timeout: float = 10.0) -> MpsDaemon:
        self.control = find_control()
        for d in (self.pipe_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        r = self._run("-d")  # daemonises and returns
        if r.returncode != 0:
            raise MpsError(f"nvidia-cuda-mps-control -d failed: {(r.stderr or r.stdout).strip() or r.returncode}")
        deadline = time.time() + timeout
        while not (self.pipe_dir / "control").exists():  # the daemon's control pipe: it is up
            if time.time() > deadline:
                raise MpsError(f"MPS daemon did not come up within {timeout:.0f} s; see {self.log_dir}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.control is None:
            return
        try:
            self._run(stdin="quit\n")
        except subprocess.TimeoutExpired:
            pass  # the daemon exits on its own once its clients are gone
        self.control = None

    def __enter__(self) -> MpsDaemon:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
