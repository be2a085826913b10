"""Starting and stopping the real Triton Inference Server.

The binary is `$TRITONSERVER`, else `tritonserver` on PATH (NGC containers), else the one shipped in the
nvidia-pytriton wheel (install it with `pip install --no-deps nvidia-pytriton`; it pins numpy<2, which we do not
need since tensors cross the python backend through DLPack). The wheel is located, never imported. It keeps one
python-backend stub per Python version, so we assemble a backend folder with the stub of the running interpreter."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

from yolov9.core.errors import Unavailable
from yolov9.core.paths import PACKAGE_ROOT
from yolov9.core.processes import ManagedProcess
from yolov9.serve.mps import MpsDaemon
from yolov9.serve.processes import require_free_ports


class TritonError(Unavailable):
    pass


def _pytriton_dir() -> Path | None:
    """The server folder of the nvidia-pytriton wheel, found without importing pytriton: its __init__ needs
    packages that `pip install --no-deps` leaves out."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def find_server() -> tuple[Path, Path, dict]:
    """(binary, backend directory, extra environment)."""
    env: dict[str, str] = {}
    if os.environ.get("TRITONSERVER"):
        binary = Path(os.environ["TRITONSERVER"])
        if not binary.is_file():
            raise TritonError(f"TRITONSERVER={binary}: no such file")
        backends = Path(os.environ.get("TRITON_BACKENDS", binary.parents[1] / "backends"))
        return binary, backends, env
    on_path = shutil.which("tritonserver")
    if on_path:
        return Path(on_path), Path(os.environ.get("TRITON_BACKENDS", "/opt/tritonserver/backends")), env
    root = _pytriton_dir()
    if root is None:
        raise TritonError(
            "no Triton server found: pip install --no-deps nvidia-pytriton (ships the server binary), "
            "set TRITONSERVER, or run inside an NGC Triton container"
        )
    if not (root / "bin" / "tritonserver").is_file():
        raise TritonError(
            f"nvidia-pytriton is installed but {root / 'bin' / 'tritonserver'} is missing (a partial or broken "
            "install): pip install --force-reinstall --no-deps nvidia-pytriton"
        )
    binary = root / "bin" / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonError(f"the nvidia-pytriton wheel has no python-backend stub for Python {version}")
    # a backend folder of our own: the wheel's python backend plus the stub for this interpreter
    backends = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "yolov9-trt" / f"backends-{version}"
    py = backends / "python"
    py.mkdir(parents=True, exist_ok=True)
    for f in (root / "backends" / "python").iterdir():
        if f.is_file() and not (py / f.name).exists():
            shutil.copy2(f, py / f.name)
    if not (py / "triton_python_backend_stub").exists():
        shutil.copy2(stub, py / "triton_python_backend_stub")
    for f in (binary, py / "triton_python_backend_stub"):
        f.chmod(f.stat().st_mode | 0o111)
    libs = [sysconfig.get_config_var("LIBDIR") or "", str(root.parent.parent / "nvidia_pytriton.libs")]
    env["LD_LIBRARY_PATH"] = ":".join([*libs, os.environ.get("LD_LIBRARY_PATH", "")]).strip(":")
    return binary, backends, env


def interpreter_env() -> dict[str, str]:
    """What the python-backend stub needs to import this project with the packages of the interpreter running it,
    however that was started (an activated venv, or its bin/yolov9 by path): the stub embeds an isolated Python that
    finds its site-packages the way `python3` on PATH would and ignores PYTHONPATH, which the model files
    put on sys.path themselves (serve/triton/caller_path.py)."""
    # in the order this interpreter searches them: PYTHONPATH before site-packages (a package in both, such as the
    # `nvidia` namespace of CUDA wheels, must resolve as it does here)
    paths = [str(PACKAGE_ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep), *site.getsitepackages()]
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        paths.append(site.getusersitepackages())
    env = {
        "PATH": os.pathsep.join(filter(None, [os.path.dirname(sys.executable), os.environ.get("PATH")])),
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(filter(None, paths))),
    }
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    return env


_LOAD_FAILED = re.compile(r"failed to load '([^']+)' version \d+: (?:\w+: )?(.+?)(?:\\n|\"|$)")


# what a server without a GPU logs on every start
_BENIGN = re.compile(r"NVML|CudaDriverHelper|DCGM|pinned memory|CUDA driver|cuda memory pool", re.I)


def log_cause(log_file: str | Path) -> str | None:
    """Why a Triton server did not start, in one line from its log: a model's load error (the Python exception
    its model.py raised), else the server's own error line."""
    try:
        text = Path(log_file).read_text(errors="replace")
    except OSError:
        return None
    m = _LOAD_FAILED.search(text)
    if m:
        return f"model '{m.group(1)}' failed to load: {m.group(2).strip()}"
    errors = [
        line
        for line in text.splitlines()
        if (line.startswith("error:") or line.startswith("E")) and not _BENIGN.search(line)
    ]
    return errors[-1].strip() if errors else None


def exit_cause(returncode: int | None, log_file: str | Path | None) -> str:
    """Why a server process ended: the signal that killed it, else the cause in its log."""
    if returncode is not None and returncode < 0:
        return f"killed by signal {-returncode} ({signal.Signals(-returncode).name})"
    return (log_cause(log_file) if log_file else None) or "no cause in its log"


class TritonServer(ManagedProcess):
    """A tritonserver process on loopback; use as a context manager or call start()/stop()."""

    stop_signal = signal.SIGINT  # Triton unloads its models and exits cleanly on SIGINT
    stop_timeout = 20.0

    def __init__(
        self,
        repo: str | Path,
        ports: tuple[int, int, int] = (8000, 8001, 8002),
        host: str = "127.0.0.1",
        log_file: str | Path | None = None,
        extra_args: list[str] | None = None,
        mps: bool = False,
        env: dict[str, str] | None = None,
    ):
        """ports: HTTP, gRPC and metrics; env: variables for this server only (the GPU it sees, its CPU threads)."""
        super().__init__()
        self.repo, self.host = Path(repo).resolve(), host
        self.http_port, self.grpc_port, self.metrics_port = ports
        self.log_file, self.extra_args = log_file, extra_args or []
        self.mps: MpsDaemon | None = MpsDaemon() if mps else None
        self.env = env or {}

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def start(self, timeout: float = 180.0, model: str | None = None) -> TritonServer:
        binary, backends, env_extra = find_server()
        env = {**os.environ, **env_extra, **interpreter_env()}
        env.update(self.env)
        ports = {"--triton-http-port": self.http_port, "--triton-grpc-port": self.grpc_port}
        require_free_ports(self.host, {**ports, "--triton-metrics-port": self.metrics_port})
        if self.mps is not None:  # before Triton: the model instances must find the daemon when they open CUDA
            env.update(self.mps.start().env)
        cmd = [
            str(binary),
            f"--model-repository={self.repo}",
            f"--backend-directory={backends}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--log-verbose=0",
            "--exit-timeout-secs=10",
            *self.extra_args,
        ]
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.wait_ready(timeout, model)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        super().stop()
        if self.mps is not None:
            self.mps.stop()

    def kill(self) -> None:
        super().kill()
        if self.mps is not None:
            self.mps.stop()

    def ready(self, model: str | None = None) -> bool:
        url = f"{self.http_url}/v2/models/{model}/ready" if model else f"{self.http_url}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float, model: str | None = None) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                cause = log_cause(self.log_file) if self.log_file else None
                raise TritonError(
                    f"tritonserver exited with code {self.proc.returncode}"
                    + (f": {cause}" if cause else "")
                    + (f" (log: {self.log_file})" if self.log_file else "")
                )
            if self.ready(model):
                return
            time.sleep(0.3)
        self.stop()
        raise TritonError(
            f"tritonserver not ready after {timeout:.0f} s" + (f"; see {self.log_file}" if self.log_file else "")
        )
