"""Servers run as child process groups (tritonserver, uvicorn with its workers): stopping, killing, `with`."""

from __future__ import annotations

import os
import signal
import subprocess


class ManagedProcess:
    """A server process started in its own session; stop() signals the whole group and waits."""

    stop_signal = signal.SIGTERM
    stop_timeout = 15.0

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if not self.running():
            return
        os.killpg(self.proc.pid, self.stop_signal)
        try:
            self.proc.wait(self.stop_timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """Hard stop (tests: a server dies under its clients)."""
        if self.running():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
