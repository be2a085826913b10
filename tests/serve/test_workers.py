"""Gateway workers on their own SO_REUSEPORT sockets, and the MPS daemon option of the Triton server."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import psutil
import pytest
import torch

from tests.serve.conftest import free_port
from yolov9.core.errors import BadInput, Unavailable
from yolov9.serve.gateway import workers
from yolov9.serve.gateway.process import GatewayProcess
from yolov9.serve.mps import MpsDaemon
from yolov9.serve.stack import ServingStack, StackConfig


def _connections_per_worker(gw: GatewayProcess) -> dict[int, int]:
    """Established connections of each worker (the children listening on the port; not multiprocessing's helper)."""
    out = {}
    for child in psutil.Process(gw.proc.pid).children():
        conns = [c for c in child.net_connections(kind="tcp") if c.laddr.port == gw.port]
        if any(c.status == psutil.CONN_LISTEN for c in conns):
            out[child.pid] = sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED)
    return out


@pytest.mark.skipif(not workers.supported(), reason="SO_REUSEPORT balancing is Linux-only")
def test_workers_share_keepalive_connections_and_a_dead_worker_is_replaced():
    # no Triton needed for /healthz; a worker restarted below must not wait for one before it accepts
    with GatewayProcess(["127.0.0.1:1"], port=free_port(), workers=4, startup_wait_s=0) as gw:
        gw.start()

        async def hold_connections(n: int) -> dict[int, int]:
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=n), timeout=30) as c:
                gate = asyncio.Event()

                async def one():  # all n requests in flight at once: n connections
                    await gate.wait()
                    return (await c.get(f"{gw.url}/healthz")).status_code

                tasks = [asyncio.create_task(one()) for _ in range(n)]
                await asyncio.sleep(0.1)
                gate.set()
                assert await asyncio.gather(*tasks) == [200] * n
                return _connections_per_worker(gw)  # while the keep-alive connections are still open

        per_worker = asyncio.run(hold_connections(64))
        # one shared socket left some workers without a single connection (measured: 5/29/30/0 over 4 workers)
        assert len(per_worker) == 4 and sum(per_worker.values()) == 64, per_worker
        assert min(per_worker.values()) >= 1, per_worker

        victim = next(iter(per_worker))
        os.kill(victim, signal.SIGKILL)
        deadline = time.time() + 30
        while time.time() < deadline:
            pids = set(_connections_per_worker(gw))
            if len(pids) == 4 and victim not in pids:
                break
            time.sleep(0.2)
        assert len(pids) == 4 and victim not in pids, pids
        assert all(httpx.get(f"{gw.url}/healthz").status_code == 200 for _ in range(8))


class _Metrics(BaseHTTPRequestHandler):
    """Another server's 200 on every path, as Triton's metrics endpoint answers."""

    def do_GET(self):
        body = b"# HELP nv_inference_count Number of inferences\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_gateway_whose_port_another_server_answers_on_is_not_taken_for_ready(tmp_path):
    other = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        port = other.server_address[1]
        gw = GatewayProcess(["127.0.0.1:1"], port=port, log_file=tmp_path / "gw.log")
        with pytest.raises(Unavailable, match="gateway exited with code"):
            gw.start(timeout=60)
    finally:
        other.shutdown()
        other.server_close()
    assert not gw.running()


@pytest.mark.parametrize("servers,port_of", [(1, lambda p: p[2]), (2, lambda p: p[1] + 10)])
def test_a_gateway_port_that_is_a_triton_port_is_refused_before_anything_starts(tmp_path, servers, port_of):
    ports = (free_port(), free_port(), free_port())
    cfg = StackConfig(str(tmp_path / "none.onnx"), port=port_of(ports), triton_ports=ports, servers=servers)
    with pytest.raises(BadInput, match=f"--port {cfg.port} is also Triton"):
        ServingStack(cfg).__enter__()


def test_a_gateway_port_in_use_is_refused_before_triton_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        cfg = StackConfig(str(tmp_path / "none.onnx"), port=taken.getsockname()[1], repo=str(tmp_path / "repo"))
        with pytest.raises(Unavailable, match="--port"):
            ServingStack(cfg).__enter__()
    assert not (tmp_path / "repo").exists(), "the repository was built before the port was checked"


@pytest.mark.skipif(not workers.supported(), reason="SO_REUSEPORT balancing is Linux-only")
def test_gateway_on_a_port_in_use_fails_with_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gw = GatewayProcess(["127.0.0.1:1"], port=port, workers=2, log_file=tmp_path / "gw.log")
        with pytest.raises(RuntimeError, match="exited with code 2"):
            gw.start(timeout=30)
    assert f"port {port} on 127.0.0.1 is in use" in (tmp_path / "gw.log").read_text()


def test_mps_without_its_control_program_is_a_one_line_error(tmp_path):
    if shutil.which("nvidia-cuda-mps-control"):
        pytest.skip("this machine has nvidia-cuda-mps-control: the missing-program error cannot happen here")
    r = subprocess.run(
        [sys.executable, "-m", "yolov9", "serve", "triton", "--mps", "--repo", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "nvidia-cuda-mps-control" in lines[0], r.stderr


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and shutil.which("nvidia-cuda-mps-control")),
    reason="needs a CUDA GPU and nvidia-cuda-mps-control (NVIDIA driver utilities)",
)
def test_mps_daemon_serves_a_cuda_process_and_stops(tmp_path):
    with MpsDaemon(tmp_path / "mps") as mps:
        assert (mps.pipe_dir / "control").exists()
        code = "import torch; print(float(torch.ones(4, device='cuda').sum()))"
        r = subprocess.run([sys.executable, "-c", code], env={**os.environ, **mps.env}, capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.strip() == "4.0", r.stderr
        # the control daemon starts an MPS server for its first client and logs it
        assert "server" in (mps.log_dir / "control.log").read_text().lower()
    assert mps.control is None


def _read_response(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when that happened."""
    t0, data = time.monotonic(), b""
    sock.settimeout(limit_s)
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except TimeoutError:
        pass
    return data, time.monotonic() - t0


@pytest.mark.skipif(not workers.supported(), reason="the guarded protocol runs in the Linux worker runner")
def test_slow_headers_and_bodies_get_408_and_connections_are_bounded():
    with GatewayProcess(["127.0.0.1:1"], port=free_port(), header_timeout_s=1, body_timeout_s=1) as gw:
        gw.start()
        with socket.create_connection((gw.host, gw.port)) as s:  # a header line every 0.4 s: cut after 1 s
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            t0 = time.monotonic()
            for k in range(15):
                try:
                    s.sendall(f"X-Slow-{k}: 1\r\n".encode())
                except OSError:
                    break
                time.sleep(0.4)
                if time.monotonic() - t0 > 4:
                    break
            data, _ = _read_response(s, 3)
        assert data.startswith(b"HTTP/1.1 408") and b'"error": "timeout"' in data and b"headers" in data, data
        with socket.create_connection((gw.host, gw.port)) as s:  # headers in time, then no body
            s.sendall(b"POST /v1/detect HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\nContent-Length: 100\r\n\r\n")
            data, took = _read_response(s, 5)
        assert data.startswith(b"HTTP/1.1 408") and b"body" in data and took < 3, (data, took)
        assert httpx.get(f"{gw.url}/healthz").status_code == 200  # a prompt client is served as before
    with GatewayProcess(["127.0.0.1:1"], port=free_port(), max_connections=2, header_timeout_s=30) as gw:
        gw.start()
        held = [socket.create_connection((gw.host, gw.port)) for _ in range(2)]
        time.sleep(0.3)
        with socket.create_connection((gw.host, gw.port)) as s:
            data, _ = _read_response(s, 3)
        assert data.startswith(b"HTTP/1.1 503") and b"open connections" in data, data
        for h in held:
            h.close()


def test_a_starting_worker_waits_for_triton_before_it_takes_requests():
    """Workers started before Triton answers: the first request waits (in the worker's listening queue) until that
    worker has reached Triton, instead of an early 503 from a worker still connecting."""
    from yolov9.core.paths import sample_images
    from yolov9.serve.bench_gateway import StubTritonProcess

    grpc_port, port = free_port(), free_port()
    env = {**os.environ, "YOLOV9_TRITON_URLS": f"127.0.0.1:{grpc_port}", "YOLOV9_STARTUP_WAIT_S": "30"}
    cmd = [sys.executable, "-m", "yolov9.serve.gateway.workers", "--workers", "2", "--port", str(port)]
    gw = subprocess.Popen(cmd, env=env, start_new_session=True)
    stub = StubTritonProcess(grpc_port)
    try:
        time.sleep(3)  # the workers are up and looking for Triton: none is there yet
        assert gw.poll() is None
        with httpx.Client(timeout=60) as client:
            image = sample_images()[0].read_bytes()
            late = threading.Timer(2, stub.start)  # Triton comes up while the request waits
            sent = time.monotonic()
            late.start()
            r = client.post(f"http://127.0.0.1:{port}/v1/detect", content=image, headers={"Content-Type": "image/jpeg"})
            late.join()
            assert stub.running() and r.status_code == 200, r.text
            assert time.monotonic() - sent >= 2  # it was held until Triton answered, not refused
            assert len(r.json()["detections"]) == 3
    finally:
        stub.stop()
        os.killpg(gw.pid, signal.SIGTERM)
        gw.wait(30)


@pytest.mark.skipif(not workers.supported(), reason="one socket per worker (which worker answers) is Linux-only")
def test_readyz_is_503_while_any_worker_is_stuck(triton):
    settings = {"ready_max_age_s": 2.0, "health_interval_s": 0.2}
    with GatewayProcess([triton.grpc_url], port=free_port(), workers=2, **settings) as gw:
        gw.start()
        gw.wait_ready(60)
        assert httpx.get(f"{gw.url}/readyz").json() == {"status": "ready", "workers_ready": 2, "workers": 2}
        victim = next(iter(_connections_per_worker(gw)))
        os.kill(victim, signal.SIGSTOP)  # a hung worker: alive, its socket still takes connections
        try:
            answer, deadline = None, time.time() + 30
            while answer is None and time.time() < deadline:
                try:  # a new connection each time: those the kernel gives the stopped worker time out
                    r = httpx.get(f"{gw.url}/readyz", timeout=1)
                except httpx.TimeoutException:
                    continue
                if r.status_code == 503:
                    answer = r
                time.sleep(0.2)
            assert answer is not None, "/readyz stayed 200 with a worker stopped"
            assert answer.json()["detail"] == "1 of 2 gateway workers reach Triton" and answer.headers["retry-after"]
        finally:
            os.kill(victim, signal.SIGCONT)
        gw.wait_ready(30)
