"""The serving stack as `yolov9 serve` starts it: a model repository for one engine, the Triton server on it and
the gateway in front, all on loopback by default; one context manager for the CLI, quickstart and tests."""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from yolov9.core.detection_defaults import CONF
from yolov9.core.errors import BadInput, Unavailable
from yolov9.core.paths import sample_images
from yolov9.serve.config import RepoConfig
from yolov9.serve.deploy import serving_model
from yolov9.serve.gateway.process import GatewayProcess
from yolov9.serve.processes import require_free_ports
from yolov9.serve.repository import build_repo
from yolov9.serve.triton_server import TritonServer, exit_cause

PORT_STEP = 10  # server k of a stack listens on the first server's ports + 10 k


def server_ports(first: tuple[int, int, int], k: int) -> tuple[int, int, int]:
    """Server k's HTTP, gRPC and metrics ports, from the first server's."""
    return tuple(p + PORT_STEP * k for p in first)


@dataclass
class StackConfig:
    engine: str  # engine file, checkpoint or zoo name
    repo: str | None = None  # None: a fresh temporary folder
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    triton_ports: tuple[int, int, int] = (8000, 8001, 8002)  # HTTP, gRPC, metrics of the first server
    mps: bool = False
    timeout: float = 300.0
    model: RepoConfig = field(default_factory=RepoConfig)  # how the repository serves the engine
    servers: int = 1  # Triton servers behind the gateway (one per GPU where there are several)
    restarts: int = 5  # crashes of one server in a row that are restarted before the stack gives up


class ServingStack:
    """Repository, Triton servers and the gateway; `supervise()` restarts a crashed server (backoff, a bounded
    number of tries, each with the cause from its log) and raises once it gives up."""

    def __init__(self, cfg: StackConfig):
        self.cfg = cfg
        self.log_dir = Path(tempfile.mkdtemp(prefix="yolov9-serve-"))
        self.tritons: list[TritonServer] = []
        self.gateway: GatewayProcess | None = None
        self.repo: Path | None = None

    @property
    def triton(self) -> TritonServer:
        return self.tritons[0]

    def _servers(self) -> list[TritonServer]:
        cfg, name = self.cfg, self.cfg.model.name
        if cfg.servers > 1 and cfg.mps and _gpus() < cfg.servers:
            raise BadInput("--mps runs one MPS daemon per GPU: with several servers give each its own GPU")
        args = ["--model-control-mode=explicit", f"--load-model={serving_model(self.repo, name)}"]
        out, gpus = [], _gpus()
        for k in range(cfg.servers):
            ports = server_ports(cfg.triton_ports, k)
            env = {"CUDA_VISIBLE_DEVICES": str(k % gpus)} if gpus > 1 else {}
            if cfg.servers > 1:  # servers sharing the CPU: each its share of the cores, or their threads thrash
                env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // cfg.servers))
            log = self.log_dir / ("triton.log" if k == 0 else f"triton{k}.log")
            out.append(TritonServer(self.repo, ports, cfg.host, log, args, cfg.mps, env))
        return out

    def _check_ports(self) -> None:
        """Before anything starts: the gateway's port is none of the Triton servers' (one of them would take it and
        answer the gateway's readiness checks) and is free now, so a taken port costs no Triton start."""
        flags = ("--triton-http-port", "--triton-grpc-port", "--triton-metrics-port")
        for k in range(self.cfg.servers):
            for flag, port in zip(flags, server_ports(self.cfg.triton_ports, k)):
                if port == self.cfg.port:
                    server = f"Triton server {k}'s" if self.cfg.servers > 1 else "Triton's"
                    raise BadInput(
                        f"--port {self.cfg.port} is also {server} port ({flag}"
                        f"{f' + {PORT_STEP * k}' if k else ''}): give the gateway another"
                    )
        require_free_ports(self.cfg.host, {"--port": self.cfg.port})

    def __enter__(self) -> ServingStack:
        cfg = self.cfg
        self._check_ports()
        print(f"logs in {self.log_dir} (triton*.log, gateway.log)", flush=True)
        self.repo = Path(cfg.repo or tempfile.mkdtemp(prefix="yolov9-repo-"))
        build_repo(cfg.engine, self.repo, cfg.model)  # a fresh repository: version 1 of this engine
        self.tritons = self._servers()
        try:
            for srv in self.tritons:
                srv.start(cfg.timeout, model=serving_model(self.repo, cfg.model.name))
            log = self.log_dir / "gateway.log"
            urls = [s.grpc_url for s in self.tritons]
            metrics = ",".join(s.metrics_url for s in self.tritons)
            self.gateway = GatewayProcess(
                urls,
                cfg.host,
                cfg.port,
                cfg.workers,
                log,
                model=cfg.model.name,
                repo=self.repo,
                triton_metrics_urls=metrics,
            )
            self.gateway.start()
            self.gateway.wait_ready(cfg.timeout)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        for srv in self.tritons:
            srv.stop()

    @property
    def url(self) -> str:
        return self.gateway.url

    def running(self) -> bool:
        return all(s.running() for s in self.tritons) and self.gateway.running()

    def supervise(self, stop: Callable[[], bool] = lambda: False, poll_s: float = 0.5) -> None:
        """Until stop() or an interrupt: restart a Triton server that exited, after 1, 2, 4, ... s; a server that
        crashes `restarts` times in a row (each within a minute of its start) ends the stack with an error."""
        crashes = [0] * len(self.tritons)
        started = [time.monotonic()] * len(self.tritons)
        while not stop():
            time.sleep(poll_s)
            if not self.gateway.running():
                raise Unavailable(f"the gateway exited with code {self.gateway.proc.returncode}; see {self.log_dir}")
            for k, srv in enumerate(self.tritons):
                if srv.running():
                    continue
                code, cause = srv.proc.returncode, exit_cause(srv.proc.returncode, srv.log_file)
                crashes[k] = crashes[k] + 1 if time.monotonic() - started[k] < 60 else 1
                if crashes[k] > self.cfg.restarts:
                    raise Unavailable(
                        f"Triton {srv.grpc_url} exited {crashes[k]} times in a row (last code {code}: {cause}); "
                        f"gave up (logs in {self.log_dir})"
                    )
                wait = min(2 ** (crashes[k] - 1), 30)
                print(f"Triton {srv.grpc_url} exited with code {code}: {cause}; restart {crashes[k]} of "
                      f"{self.cfg.restarts} in {wait} s", flush=True)  # fmt: skip
                time.sleep(wait)
                srv.start(self.cfg.timeout, model=serving_model(self.repo, self.cfg.model.name))
                started[k] = time.monotonic()
                print(f"Triton {srv.grpc_url} is back", flush=True)

    def detect(self, image: Path, conf: float = CONF) -> dict:
        """One POST /v1/detect of an image file, as a client sends it."""
        req = urllib.request.Request(
            f"{self.url}/v1/detect?conf={conf}",
            data=image.read_bytes(),
            headers={"Content-Type": "image/jpeg"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())


def _gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except Exception:  # no NVIDIA driver: CPU serving
        return 0


def answer_once(cfg: StackConfig, conf: float = CONF) -> dict:
    """Start the stack, send the first sample image, print and return the answer, stop."""
    sample = sample_images()[0]
    with ServingStack(cfg) as stack:
        print(f"serving {cfg.engine}: gateway {stack.url} (docs {stack.url}/docs), Triton gRPC {stack.triton.grpc_url}")
        body = stack.detect(sample, conf)
    print(
        f"POST /v1/detect?conf={conf} {sample.name} -> {len(body['detections'])} detections in {body['latency_ms']} ms"
    )
    print(json.dumps(body["detections"][:10], indent=1))
    return body


def serve_once(
    engine: str,
    port: int = 8080,
    img: int | None = None,
    conf: float = CONF,
    triton_ports: tuple[int, int, int] = (8000, 8001, 8002),
    repo: str | None = None,
) -> dict:
    """answer_once() for `engine` with the default stack (at the engine's own image size unless `img`)."""
    return answer_once(
        StackConfig(str(engine), repo, port=port, triton_ports=triton_ports, model=RepoConfig(img=img)), conf
    )
