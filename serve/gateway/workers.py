"""Several gateway workers, each on its own SO_REUSEPORT listening socket (Linux), so the kernel spreads
connections evenly over the workers.

`uvicorn --workers N` shares one listening socket, and a worker that wakes up accepts a whole burst of waiting
connections: with keep-alive clients a few workers end up holding most connections and their event loops saturate
while others idle (a long latency tail). With one socket per worker the kernel picks the socket by connection hash.

Run as `python -m serve.gateway.workers --host H --port P --workers N` (serve/gateway/process.py does); the
supervisor restarts a worker that dies and stops them all on SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import socket
import sys
import time

from yolov9.core.errors import Unavailable
from yolov9.serve.processes import require_free_ports

APP = "yolov9.serve.gateway.app:app"


def supported() -> bool:
    """SO_REUSEPORT spreads connections by hash on Linux only (BSDs and macOS give them all to the last socket)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def reuseport_sockets(host: str, port: int, n: int, backlog: int = 2048) -> list[socket.socket]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # a port someone already listens on is refused here, before SO_REUSEPORT could share it with a running gateway
    require_free_ports(host, {"--port": port})
    socks = []
    for _ in range(n):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((host, port))
        s.listen(backlog)
        socks.append(s)
    return socks


def _worker(sock: socket.socket, log_level: str) -> None:
    import uvicorn

    from yolov9.serve.gateway.guard import GuardedHttpToolsProtocol

    config = uvicorn.Config(
        APP,
        factory=True,
        http=GuardedHttpToolsProtocol,  # header/body deadlines and a connection bound (serve/gateway/guard.py)
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
        workers=1,
    )
    uvicorn.Server(config).run(sockets=[sock])


def supervise(host: str, port: int, workers: int, log_level: str = "warning") -> int:
    ctx = mp.get_context("spawn")  # a fresh interpreter per worker, as uvicorn does (no forked event-loop state)
    socks = reuseport_sockets(host, port, workers)
    stopping = False

    def stop(*_) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def start(sock: socket.socket):
        p = ctx.Process(target=_worker, args=(sock, log_level), daemon=False)
        p.start()
        return p, time.monotonic()

    procs = [start(s) for s in socks]
    quick_deaths, gave_up = 0, False
    while not stopping:
        time.sleep(0.5)
        for i, (p, started) in enumerate(procs):
            if p.is_alive() or stopping:
                continue
            _mark_dead(p.pid)
            # a worker that dies right after starting (bad configuration) would otherwise restart forever
            quick_deaths = quick_deaths + 1 if time.monotonic() - started < 5 else 0
            if quick_deaths > 2 * workers:
                print(f"gateway workers keep exiting (last code {p.exitcode}); giving up", file=sys.stderr)
                stopping = gave_up = True
                break
            print(f"gateway worker {p.pid} exited with code {p.exitcode}; restarting it", file=sys.stderr)
            procs[i] = start(socks[i])
    for p, _ in procs:  # SIGTERM (a second one does not cut uvicorn's graceful shutdown short, a SIGINT would)
        if p.is_alive():
            p.terminate()
    for p, _ in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()
        _mark_dead(p.pid)
    return 1 if gave_up else 0


def _mark_dead(pid: int | None) -> None:
    """A dead worker's live gauges (requests in flight) leave the aggregated metrics."""
    if pid and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="bind address")
    p.add_argument("--port", type=int, default=8080, help="port")
    p.add_argument("--workers", type=int, default=2, help="worker processes, one listening socket each")
    p.add_argument("--log-level", default="warning", help="uvicorn log level of the workers")
    args = p.parse_args()
    try:
        return supervise(args.host, args.port, args.workers, args.log_level)
    except (Unavailable, OSError) as e:
        print(f"gateway: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
