"""Child processes run as process groups (tritonserver, uvicorn with its workers, a compile filling inductor's caches):
stopping, killing, `with`."""

from __future__ import annotations

import os
import signal
import subprocess


class ManagedProcess:
    """A child process started in its own session (its process group: a server, the trainer's compiling process);
    stop() signals the whole group, waits for the leader, then kills what of the group outlived it: a Triton model's
    stub left behind when the server exits first, or inductor's compile workers, would otherwise run on as orphans."""

    stop_signal = signal.SIGTERM
    stop_timeout = 15.0

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.running():
            _signal_group(self.proc.pid, self.stop_signal)
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                pass
        self._kill_group()

    def kill(self) -> None:
        """Hard stop (tests: a server dies under its clients)."""
        self._kill_group()

    def _kill_group(self) -> None:
        if self.proc is not None:
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # nothing of the group is left
        pass
