"""`yolov9 val --url`: a running deployment scored over HTTP (gateway) and gRPC (Triton) on the dataset's original
files equals `val` of the same weights in the deployment protocol."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.serve.conftest import free_port
from yolov9.core.coco_names import COCO_NAMES
from yolov9.serve.config import RepoConfig
from yolov9.serve.stack import ServingStack, StackConfig


def _map(stdout: str) -> tuple[float, float]:
    line = stdout.strip().splitlines()[-1]
    return float(line.split("mAP50-95")[1].split()[0]), float(line.split("mAP50 ")[-1].split()[0])


def _val(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "yolov9", "val", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_val_of_a_live_endpoint_equals_local_deployment_val(trained_tiny, tiny_subset, tmp_path):
    data = tmp_path / "d.yaml"
    data.write_text(yaml.safe_dump({"path": str(tiny_subset), "train": "images", "names": COCO_NAMES}))
    common = ["--data", str(data), "--max-det", "100", "--conf", "0.001"]
    local = _val(str(trained_tiny), "--device", "cpu", "--square", "--single-label", "--workers", "0", *common)
    assert "deployment protocol" in local
    ports = (free_port(), free_port(), free_port())
    cfg = StackConfig(str(trained_tiny), str(tmp_path / "repo"), port=free_port(), triton_ports=ports)
    cfg.model = RepoConfig(kind="cpu", max_det=100, max_batch=8)
    with ServingStack(cfg) as stack:
        http = _val("--url", stack.url, *common)
        grpc = _val("--url", stack.triton.grpc_url, *common)
    want = _map(local)
    assert want[0] > 0.05
    for name, out in (("http", http), ("grpc", grpc)):  # the gateway rounds boxes to 0.01 px and scores to 1e-5
        assert _map(out) == pytest.approx(want, abs=2e-3), (name, _map(out), want, out[-3000:])
    assert "endpoint http://127.0.0.1" in http
