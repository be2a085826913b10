"""Serving operations with the real Triton servers and the real gateway: two servers with failover, a stack that
restarts a crashed server, a new model version without downtime, and the page that tries the detector in a real
headless Chromium."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import IMG
from yolov9.core.paths import sample_images
from yolov9.serve.config import RepoConfig
from yolov9.serve.processes import free_port
from yolov9.serve.stack import ServingStack, StackConfig, server_ports


def _free_block(servers: int) -> tuple[int, int, int]:
    """A first server's three ports such that every server's (+10 k) are free, and a gateway port after them."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        ports = [p for k in range(servers) for p in server_ports((base, base + 1, base + 2), k)]
        if max(ports) < 65000 and all(_free(p) for p in ports):
            return base, base + 1, base + 2
    raise RuntimeError("no free port block")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _gateway_port(block: tuple[int, int, int], servers: int) -> int:
    """A free port that none of the servers' ports (picked first, not yet bound) is: the kernel hands out ports
    near one another, and a Triton server that took the gateway's would answer its readiness checks."""
    taken = {p for k in range(servers) for p in server_ports(block, k)}
    for _ in range(50):
        if (port := free_port()) not in taken:
            return port
    raise RuntimeError("no free gateway port")


def _stack(engine, tmp_path, servers: int = 1, workers: int = 2, img: int = IMG) -> StackConfig:
    model = RepoConfig(kind="cpu", img=img, max_batch=8, queue_delay_us=1000)
    block = _free_block(servers)
    return StackConfig(str(engine), str(tmp_path / "repo"), port=_gateway_port(block, servers), workers=workers,
                       triton_ports=block, model=model, servers=servers)  # fmt: skip


def _kill(server) -> None:
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait()


def _served(metrics_url: str) -> float:
    """Requests a Triton server has answered (its own counter)."""
    text = urllib.request.urlopen(metrics_url, timeout=3).read().decode()
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith("nv_inference_request_success{"))


def _detect(url: str, data: bytes, conf: float = 0.25) -> httpx.Response:
    return httpx.post(f"{url}/v1/detect?conf={conf}", content=data, headers={"Content-Type": "image/jpeg"}, timeout=30)


def test_two_servers_fail_over_without_failed_requests_and_recover(checkpoint, tmp_path):
    data = sample_images()[0].read_bytes()
    with ServingStack(_stack(checkpoint, tmp_path, servers=2)) as stack:
        a, b = stack.tritons
        out = tmp_path / "failover.json"
        cmd = [sys.executable, "-m", "yolov9", "loadtest", "--url", stack.url, "--concurrency", "2", "--duration",
               "14", "--warmup", "1", "--timeline", "--out", str(out)]  # fmt: skip
        load = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(5.5)  # 4 s of measured load, then server b dies under it
        _kill(b)
        _, err = load.communicate(timeout=120)
        assert load.returncode == 0, err[-2000:]
        step = json.loads(out.read_text())["steps"][0]
        assert step["errors"] == {} and step["ok"] > 20, step  # retried on server a: no client saw a failure
        timeline = step["timeline"]
        before = sorted(x["p99_ms"] for x in timeline[:4] if x["p99_ms"])
        normal = before[len(before) // 2]
        after = sorted(x["p99_ms"] for x in timeline[9:13] if x["p99_ms"])  # 5 s and more after the kill
        # back to normal in at least three of those four seconds: a gateway still trying the dead server would
        # be slow in every one (a single half-second pause within one of them was seen once on a 2-core machine)
        assert len(after) >= 3 and after[-2] <= 3 * normal + 100, (normal, timeline)
        assert (tmp_path / "failover_timeline.png").exists()
        # b restarted: it takes traffic again within 10 s of answering
        b.start(180, model="yolov9")
        served, t0 = _served(b.metrics_url), time.monotonic()
        while _served(b.metrics_url) == served:
            assert _detect(stack.url, data).status_code == 200
            assert time.monotonic() - t0 < 10, "the restarted server got no traffic within 10 s"
        # the worker that answers /v1/models may not be the one that sent b traffic: it sees b up at its next
        # health check (every 0.5 s)
        t0 = time.monotonic()
        while True:
            models = httpx.get(f"{stack.url}/v1/models").json()["models"][0]
            if all(e["state"] == "up" for e in models["endpoints"]) or time.monotonic() - t0 > 3:
                break
            time.sleep(0.2)
        assert {e["url"] for e in models["endpoints"]} == {a.grpc_url, b.grpc_url}
        assert all(e["state"] == "up" for e in models["endpoints"]), models["endpoints"]
        # both gone: 503 with Retry-After; back without restarting the gateway
        _kill(a)
        _kill(b)
        time.sleep(1.5)
        r = _detect(stack.url, data)
        assert r.status_code == 503 and r.headers.get("retry-after") and r.json()["error"] == "unavailable"
        assert httpx.get(f"{stack.url}/readyz").status_code == 503
        a.start(180, model="yolov9")
        t0 = time.monotonic()
        while _detect(stack.url, data).status_code != 200:
            assert time.monotonic() - t0 < 10
            time.sleep(0.3)
        metrics = httpx.get(f"{stack.url}/metrics").text
        assert f'gateway_endpoint_requests_total{{endpoint="{a.grpc_url}"}}' in metrics
        assert "gateway_retries_total" in metrics


def test_the_stack_restarts_a_crashed_triton_and_gives_up_with_an_error(checkpoint, tmp_path, capsys):
    from yolov9.core.errors import Unavailable

    cfg = _stack(checkpoint, tmp_path, workers=1)
    with ServingStack(cfg) as stack:
        stop = threading.Event()
        errors: list[BaseException] = []

        def watch():
            try:
                stack.supervise(stop.is_set, poll_s=0.2)
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=watch)
        t.start()
        pid = stack.triton.proc.pid
        _kill(stack.triton)
        t0 = time.monotonic()
        while not (stack.triton.running() and stack.triton.proc.pid != pid and stack.triton.ready("yolov9")):
            assert time.monotonic() - t0 < 240 and not errors, errors
            time.sleep(0.5)
        while _detect(stack.url, sample_images()[0].read_bytes()).status_code != 200:  # the gateway's next check
            assert time.monotonic() - t0 < 250
            time.sleep(0.3)
        stop.set()
        t.join()
        out = capsys.readouterr().out
        assert (
            "exited with code -9: killed by signal 9 (SIGKILL)" in out and "restart 1 of 5" in out and "is back" in out
        )
        stack.cfg.restarts = 0  # now a crash is one too many
        _kill(stack.triton)
        with pytest.raises(Unavailable, match="exited 1 times in a row .*gave up"):
            stack.supervise(poll_s=0.2)


def test_serve_triton_exits_non_zero_when_its_server_dies_and_a_busy_port_is_named(checkpoint, tmp_path):
    import psutil

    from yolov9.serve.repository import build_repo

    build_repo(checkpoint, tmp_path / "repo", RepoConfig(kind="cpu", img=IMG))
    http, grpc, metrics = _free_block(1)
    cmd = [
        sys.executable,
        "-m",
        "yolov9",
        "serve",
        "triton",
        "--repo",
        str(tmp_path / "repo"),
        "--triton-http-port",
        str(http),
        "--triton-grpc-port",
        str(grpc),
        "--triton-metrics-port",
        str(metrics),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    t0 = time.monotonic()
    while not _answers(http):
        assert proc.poll() is None and time.monotonic() - t0 < 240
        time.sleep(0.5)
    busy = subprocess.run(cmd, capture_output=True, text=True, timeout=60)  # the same ports again
    assert busy.returncode == 2 and f"port {http} on 127.0.0.1 is in use" in busy.stderr, busy.stderr
    server = next(c for c in psutil.Process(proc.pid).children(recursive=True) if "tritonserver" in c.name())
    os.killpg(server.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "exited with code -9" in err, err


def _answers(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def deployed(checkpoint, trained_tiny, tmp_path_factory):
    """A stack serving the random-weights checkpoint as version 1 (160 px, trained_tiny's size)."""
    tmp = tmp_path_factory.mktemp("deploy")
    with ServingStack(_stack(checkpoint, tmp, img=160)) as stack:
        yield stack


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yolov9", *args], capture_output=True, text=True, timeout=600)


def test_deploy_and_rollback_under_load_fail_no_request(deployed, trained_tiny, tmp_path):
    from yolov9.core.checkpoint import save_checkpoint
    from yolov9.core.model import DetectionModel

    url, data = deployed.url, sample_images()[0].read_bytes()
    log: list[tuple[float, float, int, int | None]] = []  # (start, end, status, version)
    stop = threading.Event()

    def load():
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                r = c.post(f"{url}/v1/detect?conf=0.25", content=data, headers={"Content-Type": "image/jpeg"})
                log.append(
                    (t0, time.monotonic(), r.status_code, r.json().get("version") if r.status_code == 200 else None)
                )

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    try:  # the load stops whatever happens, before the stack it loads goes down
        time.sleep(2)
        r = _cli("serve", "deploy", str(trained_tiny), "--gateway", url)
        assert r.returncode == 0, r.stderr
        deployed_at = time.monotonic()
        assert json.loads(r.stdout.strip().splitlines()[-1]) == {"model": "yolov9", "version": 2, "previous": 1}
        versions = httpx.get(f"{url}/v1/models").json()["models"][0]["versions"]
        assert [v["version"] for v in versions if v["serving"]] == [2]
        time.sleep(2)
        rollback_started = time.monotonic()
        r = _cli("serve", "rollback", "--gateway", url)
        assert r.returncode == 0, r.stderr
        rolled_at = time.monotonic()
        time.sleep(2)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert log and all(status == 200 for _, _, status, _ in log), [x for x in log if x[2] != 200][:5]
    assert {v for *_, v in log} == {1, 2}
    assert all(v == 2 for t0, t1, _, v in log if deployed_at < t0 and t1 < rollback_started)  # after the switch
    assert all(v == 1 for t0, _, _, v in log if t0 > rolled_at + 1)  # v2 unloading: every worker back on v1
    # a broken file and a model of other classes deploy nothing; traffic stays where it was
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"PK\x03\x04 not a checkpoint")
    other = tmp_path / "three.pt"
    save_checkpoint(other, DetectionModel("gelan-t", nc=3, names=["a", "b", "c"]))
    before = sorted(p.name for p in Path(deployed.repo).iterdir())
    for bad, why in ((broken, "not"), (other, "classes differ")):
        r = _cli("serve", "deploy", str(bad), "--gateway", url)
        assert r.returncode == 2 and why in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(p.name for p in Path(deployed.repo).iterdir()) == before
    assert _detect(url, data).json()["version"] == 1
    # the version rolled away from is gone from the repository, and its number is not given to another engine
    from yolov9.serve.deploy import read_state

    assert not (Path(deployed.repo) / "yolov9__v2").exists()
    assert read_state(deployed.repo, "yolov9") == {"serving": 1, "history": [1], "latest": 2}
    r = _cli("serve", "deploy", str(trained_tiny), "--gateway", url)
    assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])["version"] == 3, r.stderr
    assert read_state(deployed.repo, "yolov9")["history"] == [1, 3]
    r = _cli("serve", "deploy", str(trained_tiny), "--gateway", url, "--keep", "2")
    assert r.returncode == 2 and "--keep" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # a load past its deadline stops the roll-out with one line; version 3 serves on, and the late version's
    # number is spent (Triton finished loading it after the deadline and then unloaded it)
    r = _cli("serve", "deploy", str(trained_tiny), "--gateway", url, "--load-timeout", "0.01")
    assert r.returncode == 2 and "yolov9__v4 did not load" in r.stderr and "within 0.01 s" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert read_state(deployed.repo, "yolov9") == {"serving": 3, "history": [1, 3], "latest": 4}
    assert _detect(url, data).json()["version"] == 3


def test_a_roll_out_process_that_dies_is_reported_by_what_the_repository_says(tmp_path, caplog):
    from yolov9.serve.gateway.errors import GatewayError
    from yolov9.serve.gateway.routers.admin import outcome

    done = json.dumps({"model": "yolov9", "version": 2, "previous": 1})
    assert outcome(0, done + "\n", "", {"serving": 2})["version"] == 2
    # printed its result last, then died at exit: the repository records the version, so the roll-out happened
    assert outcome(-signal.SIGSEGV, done, "", {"serving": 2})["version"] == 2
    cases = [(-signal.SIGSEGV, done, "", {"serving": 1}, "died of SIGSEGV; the repository serves version 1"),
             (-signal.SIGKILL, "", "", {"serving": 1}, "died of SIGKILL"),
             (2, "", "yolov9 serve: error: x.pt: no such engine or checkpoint file\n", {"serving": 1},
              "x.pt: no such engine or checkpoint file")]  # fmt: skip
    for code, out, err, state, want in cases:
        with pytest.raises(GatewayError) as e:
            outcome(code, out, err, state)
        assert e.value.status == 422 and want in e.value.detail, e.value.detail
    # what a process that died of a signal printed (faulthandler's stack) goes to the gateway's log
    with pytest.raises(GatewayError), caplog.at_level("ERROR", logger="uvicorn.error"):
        outcome(-signal.SIGSEGV, "", "Fatal Python error: Segmentation fault\n  File x.py, line 3\n", {"serving": 1})
    assert "died of SIGSEGV" in caplog.text and "x.py, line 3" in caplog.text, caplog.text
    r = _cli("serve", "rollback", "--repo", str(tmp_path / "nowhere"), "--triton", "127.0.0.1:1")
    assert r.returncode == 2 and r.stderr.strip().endswith("nowhere: no such model repository"), r.stderr


def test_roll_out_processes_start_cleanly_beside_busy_grpc_channels(triton):
    """The gateway starts each roll-out as a child while its event loop (uvloop, as uvicorn picks it) has gRPC
    calls in flight. Forked by the loop itself, a few such children in a hundred died of SIGSEGV or hung before
    they ran; started by run_child, none may."""
    import tritonclient.grpc.aio as grpcclient
    import uvloop

    from yolov9.serve.gateway.routers.admin import run_child

    true, n = shutil.which("true"), 500

    async def main() -> list[int]:
        stop = asyncio.Event()

        async def calls() -> None:
            client = grpcclient.InferenceServerClient(triton.grpc_url)
            try:
                while not stop.is_set():
                    assert await client.is_server_live()
            finally:
                await client.close()

        callers = [asyncio.create_task(calls()) for _ in range(8)]
        try:
            return [(await run_child([true]))[0] for _ in range(n)]
        finally:
            stop.set()
            await asyncio.gather(*callers)

    codes = uvloop.run(asyncio.wait_for(main(), 60))
    assert codes == [0] * n, collections.Counter(codes)


def _chromium():
    for path in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if os.path.exists(path):
            return path
    pytest.skip("Debian's chromium is not installed (the README's test command installs it where apt-get may)")


@pytest.fixture(scope="module")
def trained_stack(trained_tiny, tmp_path_factory):
    with ServingStack(_stack(trained_tiny, tmp_path_factory.mktemp("page"), img=160)) as stack:
        yield stack


def test_the_page_draws_what_the_api_detects_and_shows_errors_in_words(trained_stack, tmp_path):
    from playwright.sync_api import sync_playwright

    sample = sample_images()[0]
    # the page's confidence slider goes to its minimum, so the page draws every weak box too, and the API is asked
    # the same
    conf = "0.01"
    want = _detect(trained_stack.url, sample.read_bytes(), conf=float(conf)).json()["detections"]
    assert want  # the trained model finds something in its training image
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), args=args)
        page = browser.new_page()
        page.goto(f"{trained_stack.url}/")
        page.wait_for_function("document.getElementById('classes').options.length > 0")
        page.locator("#conf").fill(conf)
        assert page.locator("#confv").inner_text() == conf
        page.set_input_files("#file", str(sample))
        page.wait_for_selector("body[data-state=done]", timeout=60000)
        drawn = page.evaluate("window.detections")
        rows = page.locator("#dets tbody tr").count()
        assert len(drawn) == len(want) == rows
        assert [d["class_name"] for d in drawn] == [d["class_name"] for d in want]
        assert page.locator("#version").inner_text() == "1" and "ms" in page.locator("#latency").inner_text()
        page.screenshot(path=str(tmp_path / "page.png"))
        text = tmp_path / "notes.txt"
        text.write_text("not an image")
        page.set_input_files("#file", str(text))
        page.wait_for_selector("body[data-state=error]", timeout=60000)
        assert "415 unsupported_type" in page.locator("#error").inner_text()
        browser.close()
    shots = Path(os.environ.get("YOLOV9_TEST_ARTIFACTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    (shots / "page.png").write_bytes((tmp_path / "page.png").read_bytes())
