"""A real Triton server and a real gateway on loopback, shared by the serving tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from yolov9.core.checkpoint import save_checkpoint
from yolov9.core.coco_names import COCO_NAMES
from yolov9.core.model import DetectionModel
from yolov9.serve.config import RepoConfig
from yolov9.serve.gateway.process import GatewayProcess
from yolov9.serve.processes import free_port  # noqa: F401 (the tests import it from here)
from yolov9.serve.repository import build_repo
from yolov9.serve.triton_server import TritonServer

IMG = 320
CONF = 1e-5  # a seeded random model scores about 1e-5: low thresholds give real, comparable detections
STAND_IN = "a stand-in nvImageCodec on PYTHONPATH"  # what its import raises


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "gelan_t.pt"
    save_checkpoint(path, DetectionModel("gelan-t", names=COCO_NAMES))
    return path


@pytest.fixture(scope="session")
def triton(checkpoint, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    config = RepoConfig(max_batch=16, queue_delay_us=1000, kind="cpu", img=IMG, decoder="nvimgcodec")
    build_repo(checkpoint, repo, config)
    # nvImageCodec asked for, and a stand-in for it reachable only through the caller's PYTHONPATH: the instances
    # must see that path (Triton's stub ignores it on its own) and fall back to the CPU decoder with its reason
    standin = tmp_path_factory.mktemp("pythonpath") / "nvidia" / "nvimgcodec"
    standin.mkdir(parents=True)
    (standin / "__init__.py").write_text(f"raise ImportError({STAND_IN!r})\n")
    logs = tmp_path_factory.mktemp("logs")
    srv = TritonServer(repo, (free_port(), free_port(), free_port()), log_file=logs / "triton.log")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(standin.parents[1]), os.environ.get("PYTHONPATH")])))
        srv.start(timeout=180, model="yolov9")
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def gateway(triton, tmp_path_factory):
    logs = tmp_path_factory.mktemp("gwlogs")
    gw = GatewayProcess(
        [triton.grpc_url],
        port=free_port(),
        workers=2,
        max_upload_bytes=2 * 2**20,
        # a loaded 2-core CI box answers the 200-request burst (two CPU instances behind it) in well over the default
        # 30 s: these tests are about correctness under concurrency, so the timeout is the client's
        timeout_s=120.0,
        log_file=logs / "gateway.log",
        triton_metrics_urls=triton.metrics_url,
    )
    gw.start()
    yield gw
    gw.stop()
