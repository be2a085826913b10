"""The serving stack as `yolov9 serve` starts it: a model repository for one engine, the Triton server on it and
the gateway in front, all on loopback by default; one context manager for the CLI, quickstart and tests."""

from __future__ import annotations

import json
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from yolov9.core.detection_defaults import CONF
from yolov9.core.paths import sample_images
from yolov9.serve.config import RepoConfig
from yolov9.serve.gateway.process import GatewayProcess
from yolov9.serve.repository import build_repo
from yolov9.serve.triton_server import TritonServer


@dataclass
class StackConfig:
    engine: str  # engine file, checkpoint or zoo name
    repo: str | None = None  # None: a fresh temporary folder
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    triton_ports: tuple[int, int, int] = (8000, 8001, 8002)  # HTTP, gRPC, metrics
    mps: bool = False
    timeout: float = 300.0
    model: RepoConfig = field(default_factory=RepoConfig)  # how the repository serves the engine


class ServingStack:
    def __init__(self, cfg: StackConfig):
        self.cfg = cfg
        self.log_dir = Path(tempfile.mkdtemp(prefix="yolov9-serve-"))
        self.triton: TritonServer | None = None
        self.gateway: GatewayProcess | None = None

    def __enter__(self) -> ServingStack:
        cfg = self.cfg
        print(f"logs in {self.log_dir} (triton.log, gateway.log)", flush=True)
        repo = cfg.repo or tempfile.mkdtemp(prefix="yolov9-repo-")
        build_repo(cfg.engine, repo, cfg.model)
        self.triton = TritonServer(repo, cfg.triton_ports, cfg.host, self.log_dir / "triton.log", mps=cfg.mps)
        self.triton.start(cfg.timeout, model=cfg.model.name)
        log = self.log_dir / "gateway.log"
        self.gateway = GatewayProcess(
            [self.triton.grpc_url], cfg.host, cfg.port, cfg.workers, log, model=cfg.model.name
        )
        try:
            self.gateway.start()
        except BaseException:
            self.triton.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        if self.triton is not None:
            self.triton.stop()

    @property
    def url(self) -> str:
        return self.gateway.url

    def running(self) -> bool:
        return self.triton.running() and self.gateway.running()

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
