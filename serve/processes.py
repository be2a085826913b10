"""Servers run as child process groups (tritonserver, uvicorn with its workers): stopping, killing, `with`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

from yolov9.core.errors import Unavailable


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick), for servers started on loopback by benches and tests."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def require_free_ports(host: str, ports: dict[str, int]) -> None:
    """Each port must be free: a server still running there would answer the new one's readiness checks."""
    for flag, port in ports.items():
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                raise Unavailable(
                    f"port {port} on {host} is in use ({e.strerror}; another server still running?): choose another "
                    f"with {flag}"
                ) from None


class ManagedProcess:
    """A server process started in its own session (its process group); stop() signals the whole group, waits for
    the server, then kills what of the group outlived it: a Triton model's stub left behind when the server exits
    first would otherwise run on as an orphan."""

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
