"""`yolov9 loadtest` against the real gateway and Triton on loopback, and the locustfile headless."""

from __future__ import annotations

import cProfile
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_loadtest(tmp_path, target: str, url: str, extra: list[str] | None = None) -> dict:
    out = tmp_path / f"{target}.json"
    cmd = [
        sys.executable,
        "-m",
        "yolov9",
        "loadtest",
        "--target",
        target,
        "--url",
        url,
        "--concurrency",
        "1,4",
        "--duration",
        "2",
        "--warmup",
        "0.5",
        "--requests",
        "60",
        "--conf",
        "0.5",
        "--out",
        str(out),
        *(extra or []),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    for suffix in (".json", ".csv", ".png"):
        assert out.with_suffix(suffix).exists()
    return json.loads(out.read_text())


def test_sweep_against_gateway(gateway, triton, tmp_path):
    res = _run_loadtest(tmp_path, "gateway", gateway.url, ["--triton-metrics", triton.metrics_url])
    steps = res["steps"]
    assert [s["concurrency"] for s in steps] == [1, 4]
    for s in steps:
        assert s["errors"] == {} and s["ok"] > 0 and s["images_per_s"] > 0, s
        assert s["requests"] <= 60  # --requests caps the measured requests (warm-up ones not counted)
        assert s["p50_ms"] <= s["p99_ms"] <= s["max_ms"]
        assert s["client_cpu_pct"] is not None
        assert s["triton_avg_batch"] >= 1.0 and s["triton_compute_ms"] > 0
        # the gateway's own wait on Triton is part of each client-side latency
        assert 0 < s["backend_p50_ms"] <= s["backend_p99_ms"] <= s["max_ms"]
        # the cores each serving part kept busy (the model's stubs run the CPU engine: they are the busiest)
        cores = s["cores_busy"]
        assert set(cores) == {"host", "triton", "stubs", "gateway"}, cores
        assert min(cores.values()) > 0 and cores["stubs"] <= cores["host"] <= os.cpu_count() + 0.5, cores


def test_sweep_directly_against_triton_with_two_procs(triton, tmp_path):
    res = _run_loadtest(tmp_path, "triton", triton.grpc_url, ["--procs", "2", "--triton-metrics", triton.metrics_url])
    for s in res["steps"]:
        # concurrency is the total in flight: concurrency 1 is one process sending one request at a time
        assert s["errors"] == {} and 0 < s["ok"] <= 60 and s["procs"] == min(2, s["concurrency"])
        assert "backend_p50_ms" not in s  # only the gateway reports its wait on Triton
    assert res["steps"][0]["triton_avg_batch"] == 1.0
    # the model instances' own split of each image's time (serve/triton/model.py), over the same steps
    for s in res["steps"]:
        split = s["instance_ms_per_image"]
        assert set(split) == {"requests", "decode", "letterbox", "engine", "nms", "responses"}, split
        assert split["decode"] > 0 and split["engine"] > 0 and min(split.values()) >= 0, split
    # --plot draws saved results on one chart and sends nothing
    (tmp_path / "again.json").write_text((tmp_path / "triton.json").read_text())
    files = [str(tmp_path / "triton.json"), str(tmp_path / "again.json")]
    cmd = [sys.executable, "-m", "yolov9", "loadtest", "--plot", *files, "--out", str(tmp_path / "both.json")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "both.png").stat().st_size > 10_000 and not (tmp_path / "both.json").exists()


def test_open_loop_rate(gateway, tmp_path):
    out = tmp_path / "rate.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "yolov9",
            "loadtest",
            "--url",
            gateway.url,
            "--rate",
            "20",
            "--duration",
            "2",
            "--warmup",
            "0.5",
            "--conf",
            "0.5",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (step,) = json.loads(out.read_text())["steps"]
    assert step["rate"] == 20 and step["errors"] == {} and 25 <= step["ok"] <= 60


def test_locustfile_headless(gateway, tmp_path):
    prefix = tmp_path / "locust"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(ROOT / "serve" / "locustfile.py"),
            "--headless",
            "-u",
            "4",
            "-r",
            "4",
            "-t",
            "4s",
            "--host",
            gateway.url,
            "--csv",
            str(prefix),
            "--only-summary",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "YOLOV9_LOADTEST_CONF": "0.5"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rows = (tmp_path / "locust_stats.csv").read_text().splitlines()
    header, detect = rows[0].split(","), next(x for x in rows if "/v1/detect" in x).split(",")
    stats = dict(zip(header, detect))
    assert int(stats["Request Count"]) > 0 and int(stats["Failure Count"]) == 0


def test_all_requests_failing_is_a_nonzero_exit_with_one_line(tmp_path):
    """Nothing listens on the port: every request of the step fails, and the command says so and exits 2."""
    from .conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "yolov9", "loadtest", "--url", url, "--concurrency", "2", "--duration", "1"]
    cmd += ["--warmup", "0.2", "--requests", "50", "--out", str(tmp_path / "lt.json")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "every request failed" in lines[0] and url in lines[0], r.stderr


def test_bench_gateway_measures_the_gateway_alone(tmp_path):
    """`yolov9 bench gateway`: the real gateway in front of the stand-in Triton, a short step; the numbers are
    reported, not judged (speed belongs in docs/benchmarks.md)."""
    out, prof = tmp_path / "bg.json", tmp_path / "prof.txt"
    stale = cProfile.Profile()  # an earlier run's worker dump beside the table: not part of this run
    stale.runcall(_an_earlier_run)
    stale.dump_stats(tmp_path / "prof.1.prof")
    cmd = [sys.executable, "-m", "yolov9", "bench", "gateway", "--concurrency", "2", "--duration", "1.5"]
    cmd += ["--warmup", "0.5", "--out", str(out), "--profile", str(prof)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["ok"] > 0 and row["errors"] == {} and row["gateway_workers"] == 1
    assert row["gateway_cpu_ms_per_request"] > 0
    # the same load straight at the stand-in, beside it: what the gateway adds
    assert row["direct_images_per_s"] > 0 and row["direct_p50_ms"] > 0 and row["gateway_vs_direct"] > 0
    assert row["added_p50_ms"] == round(row["p50_ms"] - row["direct_p50_ms"], 2)
    assert "requests/s" in r.stdout and "CPU ms/request" in r.stdout and "ms p50 to direct's" in r.stdout
    table = prof.read_text()
    assert "detect_one" in table and "prof.1.prof" not in table  # pstats names each dump it read


def _an_earlier_run() -> int:
    return sum(range(10))


def test_concurrency_is_the_total_in_flight_across_client_processes():
    from yolov9.serve.loadtest import Step, split_load

    def step(concurrency: int | None, rate: float | None = None) -> Step:
        return Step("gateway", "http://127.0.0.1:1", "yolov9", concurrency, rate, 0.0, 1.0, None, 0.25, 1.0)

    assert [k for _, k in split_load(step(6), 4)] == [2, 2, 1, 1]
    assert [k for _, k in split_load(step(1), 4)] == [1]
    assert abs(sum(share for share, _ in split_load(step(6), 4)) - 1.0) < 1e-9
    assert split_load(step(None, rate=100.0), 4) == [(0.25, 0)] * 4


def test_each_serving_process_is_counted_with_its_part():
    """A stub that runs from inside the server's folder is a stub, not the server (as on a pip-installed Triton)."""
    from yolov9.serve.loadtest import _part_of

    site = "/tmp/site/pytriton/tritonserver"
    assert _part_of(f"{site}/backends/python/triton_python_backend_stub /repo/yolov9/1/model.py shm 1") == "stubs"
    assert _part_of(f"{site}/bin/tritonserver --model-repository /repo --http-port 8000") == "triton"
    assert _part_of("/usr/bin/python3 -m yolov9.serve.gateway.workers --workers 12") == "gateway"
    assert _part_of("/usr/bin/python3 -m pytest tests/serve") is None


def test_cores_busy_counts_each_process_over_the_step_only():
    """A stub that exited during the step (a stopped server's) drops out rather than making its part negative; one
    that started counts from zero; a reused pid is another process."""
    from yolov9.serve.loadtest import cores_busy

    before = (100.0, {(1, 5.0): ("stubs", 40.0), (2, 5.0): ("stubs", 3.0), (3, 5.0): ("gateway", 1.0)})
    after = (104.0, {(2, 5.0): ("stubs", 4.0), (3, 5.0): ("gateway", 1.5), (1, 9.0): ("stubs", 0.5)})
    assert cores_busy(before, after, 2.0) == {"host": 2.0, "stubs": 0.75, "triton": 0.0, "gateway": 0.25}


@pytest.mark.parametrize(
    "args,message",
    [
        (["loadtest", "--concurrency", "8,0"], "--concurrency 8,0: each step needs at least 1"),
        (["loadtest", "--duration", "0"], "--duration 0.0: must be above 0"),
        (["loadtest", "--conf", "1.5"], "conf 1.5 is not in [0, 1]"),
        (["loadtest", "--plot", "missing.json"], "missing.json: no such results file"),
        (["serve", "build-repo", "--engine", "gelan-t", "--max-batch", "0"], "--max-batch 0: must be at least 1"),
        (["serve", "build-repo", "--engine", "gelan-t", "--instances", "0"], "--instances 0: must be at least 1"),
    ],
)
def test_settings_that_cannot_work_are_one_line_errors(args, message, capfd, tmp_path, monkeypatch):
    from yolov9.cli import main

    monkeypatch.chdir(tmp_path)  # nothing may be written: a build-repo refused leaves no repository
    assert main(args) == 2
    err = capfd.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not any(tmp_path.iterdir())
