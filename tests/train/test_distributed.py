"""Training under torchrun on the CPU (gloo): two ranks against one process with the same global batch, resume
with another number of ranks, one RAM cache per machine, and a killed rank ending the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml

from tests.conftest import LIGHT_HYP
from yolov9.core.checkpoint import read_checkpoint
from yolov9.train.distributed import with_device


@pytest.fixture(scope="module")
def setup(tiny_subset, tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("ddp")
    data = d / "data.yaml"
    data.write_text(yaml.safe_dump({"path": str(tiny_subset), "train": "images", "val": "images", "names": ["x"] * 80}))
    (d / "hyp.yaml").write_text(yaml.safe_dump(LIGHT_HYP))
    return data, d


def _train_args(setup, name: str, *extra: str) -> list[str]:
    data, d = setup
    return [
        "train", "--data", str(data), "--cfg", "gelan-t", "--img", "96", "--batch", "8", "--nbs", "8",
        "--workers", "0", "--amp", "off", "--device", "cpu", "--close-mosaic", "0", "--no-val",
        "--hyp", str(d / "hyp.yaml"), "--project", str(d / "runs"), "--name", name, "--exist-ok", *extra,
    ]  # fmt: skip


def _torchrun(n: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", "-m", "yolov9"]


def _cache_maps(root: psutil.Process) -> dict[int, set[tuple[str, int]]]:
    """Per process of the tree: the (inode, mapped bytes) of each mapping of a shared image cache file."""
    out: dict[int, set[tuple[str, int]]] = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            lines = Path(f"/proc/{p.pid}/maps").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            if "yolov9-cache" in line and ".tmp" not in line:
                span, _, _, _, inode = line.split()[:5]
                lo, hi = (int(x, 16) for x in span.split("-"))
                out.setdefault(p.pid, set()).add((inode, hi - lo))
    return out


def _run(cmd: list[str], timeout: float = 300) -> tuple[str, dict[int, set[tuple[str, int]]]]:
    """Runs to the end, watching which cache file each process maps; returns (output, the mappings seen)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root, seen, deadline = psutil.Process(p.pid), {}, time.time() + timeout
    while p.poll() is None and time.time() < deadline:
        for pid, maps in _cache_maps(root).items():
            seen.setdefault(pid, set()).update(maps)
        time.sleep(0.05)
    out = p.communicate(timeout=max(1.0, deadline - time.time()))[0]
    assert p.returncode == 0, out[-3000:]
    return out, seen


def _rows(setup, name: str) -> list[dict]:
    return [json.loads(x) for x in (setup[1] / "runs" / name / "results.jsonl").read_text().splitlines()]


def test_two_ranks_match_one_process_and_resume_with_one(setup):
    two = _train_args(setup, "two", "--epochs", "2", "--stop-after", "1", "--cache", "ram")
    out2, maps2 = _run(_torchrun(2) + two)
    assert "shared by 2 local ranks" in out2
    out1, maps1 = _run([sys.executable, "-m", "yolov9", *_train_args(setup, "one", "--epochs", "2", "--cache", "ram")])
    # one copy per machine: both ranks map the same cache file, as large as the one process's
    files2, files1 = set().union(*maps2.values()), set().union(*maps1.values())
    assert len(maps2) == 2 and len(files2) == 1, maps2
    assert len(maps1) == 1 and len(files1) == 1 and files1.pop()[1] == files2.pop()[1]
    # the 2-rank checkpoint continues in one process, with the same global batch
    _run([sys.executable, "-m", "yolov9", "train", "--resume", str(setup[1] / "runs" / "two"), "--device", "cpu"])
    two, one = _rows(setup, "two"), _rows(setup, "one")
    assert [r["epoch"] for r in two] == [1, 2] and two[0]["rank_param_spread"] == 0.0
    assert two[0]["batch"] == one[0]["batch"] == 8
    for a, b in zip(two, one):  # per-rank BatchNorm statistics and loss normalisers: close, not equal
        for key in ("box", "cls", "dfl"):
            assert a[key] == pytest.approx(b[key], rel=0.05), (a["epoch"], key, a[key], b[key])


def test_killed_rank_ends_the_run_without_hanging(setup):
    cmd = _torchrun(2) + _train_args(setup, "killed", "--epochs", "200")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = setup[1] / "runs" / "killed" / "weights" / "last.pt"
    deadline = time.time() + 180
    while not last.exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.2)
    assert last.exists(), "no epoch finished"
    victim = next(c for c in psutil.Process(p.pid).children(recursive=True) if c.environ().get("RANK") == "1")
    victim.kill()
    t0 = time.time()
    out = p.communicate(timeout=90)[0]
    assert p.returncode != 0 and time.time() - t0 < 90
    assert "FAILED" in out or "failed" in out, out[-2000:]
    assert "train" in read_checkpoint(last)  # a usable checkpoint to resume from
    assert not any(c.is_running() for c in psutil.Process().children(recursive=True) if c.pid == victim.pid)


def test_device_list_argv_rewrite():
    argv = ["train", "--device", "0,1", "--batch", "16", "--device=0,1"]
    assert with_device(argv, "auto") == ["train", "--batch", "16", "--device", "auto"]
    r = subprocess.run(
        [sys.executable, "-m", "yolov9", "train", "--device", "cpu,gpu"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE")},
    )
    assert r.returncode == 2 and "a list names CUDA indices" in r.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (NCCL)")
def test_one_rank_nccl_run_equals_the_plain_run(setup):
    """torchrun with one NCCL rank (DDP-wrapped) against the plain process: the same losses for the same steps."""
    gpu = ["--epochs", "2", "--device", "0", "--no-cudnn-benchmark"]  # the last --device wins
    _run(_torchrun(1) + _train_args(setup, "nccl", *gpu))
    _run([sys.executable, "-m", "yolov9", *_train_args(setup, "plain", *gpu)])
    nccl, plain = _rows(setup, "nccl"), _rows(setup, "plain")
    assert len(nccl) == len(plain) == 2
    for a, b in zip(nccl, plain):
        for key in ("box", "cls", "dfl"):
            assert a[key] == pytest.approx(b[key], rel=1e-4), (a["epoch"], key, a[key], b[key])


def test_bench_train_under_torchrun_reports_all_ranks(tmp_path):
    out = tmp_path / "bench.json"
    cmd = _torchrun(2) + ["bench", "train", "--cfg", "gelan-t", "--data", "coco48", "--img", "96", "--batch", "4"]
    cmd += ["--amp", "off", "--steps", "2", "--warmup", "1", "--workers", "0", "--cache", "none", "--device", "cpu"]
    _run([*cmd, "--out", str(out)])
    (row,) = json.loads(out.read_text())
    assert row["gpus"] == 2 and row["batch"] == 4 and row["images_per_s"] > 0
