"""`yolov9 bench gateway`: the gateway's own cost per request, measured against a stand-in Triton that answers at
once (or after --delay-ms), so what is measured is the HTTP parse, the upload, the dependencies, the gRPC call and
the JSON answer. Reported per step: requests/s and latency (the client's view), the gateway workers' CPU
milliseconds per request (their process CPU time over the measured requests), which does not depend on how fast the
client is, and (unless --no-direct) the same load straight at the stand-in beside it: what the gateway adds."""

from __future__ import annotations

import json
import os
import pstats
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from yolov9.core.paths import PACKAGE_ROOT
from yolov9.core.processes import ManagedProcess
from yolov9.serve.config import BenchGatewayConfig
from yolov9.serve.gateway.process import GatewayProcess
from yolov9.serve.loadtest import Step, load_images, run_step
from yolov9.serve.processes import free_port


class StubTritonProcess(ManagedProcess):
    def __init__(self, port: int, delay_ms: float = 0.0):
        super().__init__()
        self.port, self.delay_ms = port, delay_ms

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> StubTritonProcess:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")])),
        }
        cmd = [
            sys.executable,
            "-m",
            "yolov9.serve.stub_triton",
            "--port",
            str(self.port),
            "--delay-ms",
            str(self.delay_ms),
        ]
        self.proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.1)
        raise TimeoutError("the stand-in Triton did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and all its descendants (the gateway's supervisor and its workers)."""
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _step(target: str, url: str, concurrency: int, cfg: BenchGatewayConfig) -> Step:
    return Step(target, url, "yolov9", concurrency, None, cfg.warmup, cfg.duration, None, 0.25, 30.0)


def with_direct(row: dict, direct: dict) -> dict:
    """The gateway's row with the same load's numbers straight at the stand-in, and what the gateway adds."""
    both = row.get("p50_ms") is not None and direct.get("p50_ms") is not None  # None: no request answered
    row.update(
        direct_images_per_s=direct["images_per_s"],
        direct_p50_ms=direct.get("p50_ms"),
        direct_p99_ms=direct.get("p99_ms"),
        added_p50_ms=round(row["p50_ms"] - direct["p50_ms"], 2) if both else None,
        gateway_vs_direct=round(row["images_per_s"] / direct["images_per_s"], 3) if direct["images_per_s"] else None,
    )
    return row


def measure(url: str, pid: int, images: list[bytes], concurrency: int, cfg: BenchGatewayConfig) -> dict:
    """One closed-loop step against the gateway at `url` whose processes descend from `pid`."""
    step = _step("gateway", url, concurrency, cfg)
    cpu0 = cpu_seconds(pid)
    row = run_step(step, images, procs=cfg.procs)
    cpu = cpu_seconds(pid) - cpu0
    sent = row.get("ok", 0) + sum(row.get("errors", {}).values())
    # the warm-up's requests are served too: spread the CPU over every request the step sent
    total = sent * (cfg.duration + cfg.warmup) / cfg.duration if sent else 0
    row["gateway_cpu_ms_per_request"] = round(1000 * cpu / total, 3) if total else None
    row["gateway_workers"] = cfg.workers
    return row


def bench_gateway(cfg: BenchGatewayConfig) -> list[dict]:
    images = load_images(cfg.images)
    settings = {}
    if cfg.profile:
        Path(cfg.profile).parent.mkdir(parents=True, exist_ok=True)
        for old in _profile_dumps(Path(cfg.profile)):  # an earlier run's workers: not this run's profile
            old.unlink()
        settings["profile"] = str(Path(cfg.profile).with_suffix(""))
    rows = []
    with StubTritonProcess(free_port(), cfg.delay_ms).start() as stub:
        gw = GatewayProcess([stub.url], port=free_port(), workers=cfg.workers, **settings)
        with gw.start():
            for c in cfg.concurrency:
                direct = run_step(_step("triton", stub.url, c, cfg), images, procs=cfg.procs) if cfg.direct else None
                row = measure(gw.url, gw.proc.pid, images, c, cfg)
                rows.append(with_direct(row, direct) if direct else row)
                added = f", adds {row['added_p50_ms']} ms p50 to direct's {row['direct_p50_ms']}" if direct else ""
                print(
                    f"gateway x{cfg.workers} c{c}: {row['images_per_s']:,.1f} requests/s, p50 {row['p50_ms']} ms, "
                    f"p99 {row['p99_ms']} ms, {row['gateway_cpu_ms_per_request']} CPU ms/request{added}, "
                    f"errors {sum(row.get('errors', {}).values())}",
                    flush=True,
                )
    if cfg.profile:
        _write_profile(Path(cfg.profile))
    if cfg.out:
        Path(cfg.out).write_text(json.dumps({"config": vars(cfg), "rows": rows}, indent=1))
    return rows


def _profile_dumps(out: Path) -> list[Path]:
    """The workers' cProfile dumps beside `out`: one per worker, <stem>.<pid>.prof."""
    return sorted(out.parent.glob(out.with_suffix("").name + ".*.prof"))


def _write_profile(out: Path) -> None:
    """The workers' cProfile dumps as one table of the top functions."""
    dumps = _profile_dumps(out)
    if not dumps:
        print(f"no profile dumps beside {out}", file=sys.stderr)
        return
    with open(out, "w") as f:
        stats = pstats.Stats(*map(str, dumps), stream=f)
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(40)
    print(f"profile: {out}")
