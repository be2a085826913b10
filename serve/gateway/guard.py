"""Slow and greedy clients: uvicorn's HTTP protocol with a deadline for a request's headers and one for its body
(a client that trickles them holds a connection open indefinitely otherwise), and a bound on open connections per
worker. Each is a gateway setting (header_timeout_s, body_timeout_s, max_connections); the answers are the
gateway's JSON errors: 408 and 503, then the connection closes."""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from yolov9.serve.gateway.settings import get_settings


def _response(status: int, reason: str, kind: str, detail: str, extra: str = "") -> bytes:
    body = json.dumps({"error": kind, "detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"connection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        s = get_settings()
        self.header_timeout, self.body_timeout, self.max_connections = (
            s.header_timeout_s,
            s.body_timeout_s,
            s.max_connections,
        )
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            detail = f"more than {self.max_connections} open connections on this worker"
            transport.write(_response(503, "Service Unavailable", "overloaded", detail, "retry-after: 1\r\n"))
            transport.close()
            return
        self._arm(self.header_timeout, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.header_timeout, "headers")  # each request of a keep-alive connection gets its own

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout, "body")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expire, seconds, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, seconds: float, what: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        detail = f"the request's {what} did not arrive within {seconds:g} s"
        self.transport.write(_response(408, "Request Timeout", "timeout", detail))
        self.transport.close()
