"""Running the gateway as a uvicorn process (N workers) on loopback, for the CLI and the tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from yolov9.core.errors import Unavailable
from yolov9.core.paths import PACKAGE_ROOT
from yolov9.core.processes import ManagedProcess


class GatewayProcess(ManagedProcess):
    def __init__(
        self,
        triton_urls: list[str],
        host: str = "127.0.0.1",
        port: int = 8080,
        workers: int = 1,
        log_file: str | Path | None = None,
        **settings,
    ):
        """settings: fields of serve/gateway/settings.py (model, api_key, max_upload_bytes, timeout_s, ...),
        handed to the workers as their YOLOV9_* variables."""
        super().__init__()
        self.host, self.port, self.workers = host, port, workers
        self.env = {**os.environ, "YOLOV9_TRITON_URLS": ",".join(triton_urls), "YOLOV9_WORKERS": str(workers)}
        for key, value in settings.items():
            if value is not None:
                self.env[f"YOLOV9_{key.upper()}"] = str(value)
        if workers > 1:  # prometheus-client aggregates the workers' metrics through files in this folder
            self.env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="yolov9-prom-")
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
        self.log_file = log_file

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> GatewayProcess:
        from yolov9.serve.gateway import workers

        if workers.supported():  # one SO_REUSEPORT socket per worker (even spread) and the guarded protocol
            cmd = [sys.executable, "-m", "yolov9.serve.gateway.workers", "--workers", str(self.workers)]
            cmd += ["--host", self.host, "--port", str(self.port), "--log-level", "warning"]
        else:
            cmd = [sys.executable, "-m", "uvicorn", workers.APP, "--factory", "--host", self.host]
            cmd += ["--port", str(self.port), "--workers", str(self.workers), "--log-level", "warning"]
            cmd += ["--timeout-graceful-shutdown", "5", "--no-access-log"]
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if self._poll("/healthz", timeout, request_timeout=1) is None:
            return self
        self.stop()
        raise Unavailable(f"gateway not answering after {timeout:.0f} s")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until /readyz is 200: every worker reaches a Triton endpoint that serves the model."""
        detail = self._poll("/readyz", timeout, request_timeout=2)
        if detail is not None:
            raise Unavailable(f"gateway not ready after {timeout:.0f} s: {detail}")

    def _poll(self, path: str, timeout: float, request_timeout: float) -> str | None:
        """GET path until the gateway answers 200 with its own JSON status (None) or timeout passes (the last
        answer or error); a gateway process that exits meanwhile is an error with its exit code. Another server on
        the port (one that took it first) answers 200 too, but not with the gateway's body."""
        deadline, last = time.time() + timeout, "no answer"
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise Unavailable(f"gateway exited with code {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}{path}", timeout=request_timeout) as r:
                    body = r.read()
                if _gateway_status(body):
                    return None
                last = f"not the gateway's answer: {body[:80]!r}"
            except urllib.error.HTTPError as e:
                last = e.read().decode(errors="replace")
            except OSError as e:
                last = str(e)
            time.sleep(0.2)
        return last


def _gateway_status(body: bytes) -> bool:
    """Whether a 200's body is the gateway's health answer ({"status": "ok" | "ready", ...})."""
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("status") in ("ok", "ready")
