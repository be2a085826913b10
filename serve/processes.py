"""Ports for the servers (tritonserver, uvicorn with its workers), which run as child process groups
(`yolov9.core.processes.ManagedProcess`)."""

from __future__ import annotations

import socket

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
