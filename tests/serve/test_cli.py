import pytest

from yolov9.cli import build_parser


def test_serve_subcommand_options_are_not_read_as_abbreviations():
    """`--triton` must reach `serve gateway`, not be taken for the parent's --triton-*-port options."""
    args = build_parser().parse_args(["serve", "gateway", "--triton", "10.0.0.2:8001", "--port", "9000"])
    assert args.triton == "10.0.0.2:8001" and args.port == 9000


def test_preferred_batch_flag_parses_lists_and_none(capsys):
    parse = build_parser().parse_args
    assert parse(["serve", "build-repo", "--engine", "e.pt2", "--preferred-batch", "8,16"]).preferred_batch == [8, 16]
    assert parse(["serve", "build-repo", "--engine", "e.pt2", "--preferred-batch", "none"]).preferred_batch == []
    defaults = parse(["serve", "build-repo", "--engine", "e.pt2"])
    assert defaults.preferred_batch is None and defaults.max_batch == 32
    with pytest.raises(SystemExit):
        parse(["serve", "build-repo", "--engine", "e.pt2", "--preferred-batch", "8,x"])
    assert "expected a comma list of integers or 'none'" in capsys.readouterr().err


def test_a_load_timeout_that_is_no_time_is_refused_before_anything_is_written(tmp_path):
    from yolov9.core.errors import BadInput
    from yolov9.serve.deploy import deploy, rollback

    for timeout in (0.0, -1.0, float("nan")):
        with pytest.raises(BadInput, match="give seconds above 0"):
            deploy(tmp_path / "x.pt", tmp_path, "yolov9", ["127.0.0.1:1"], load_timeout_s=timeout)
        with pytest.raises(BadInput, match="give seconds above 0"):
            rollback(tmp_path, "yolov9", ["127.0.0.1:1"], load_timeout_s=timeout)
    assert not any(tmp_path.iterdir())
    assert build_parser().parse_args(["serve", "rollback", "--load-timeout", "30"]).load_timeout == 30.0


def test_serve_once_answers_one_request_and_stops(checkpoint, tmp_path):
    """What `yolov9 quickstart` ends with: repository, real Triton, real gateway, one request, clean stop."""

    from yolov9.serve.stack import serve_once

    from .conftest import CONF, IMG, free_port

    ports = (free_port(), free_port(), free_port())
    body = serve_once(str(checkpoint), port=free_port(), img=IMG, conf=CONF, triton_ports=ports, repo=str(tmp_path))
    assert body["width"] > 0 and body["height"] > 0 and len(body["detections"]) > 0
    assert all(0 <= d["class_id"] < 80 and d["score"] >= CONF for d in body["detections"])


@pytest.mark.slow
def test_triton_serves_an_aoti_package(aoti_cpu_package, trained_tiny, tmp_path):
    """A .pt2 engine inside Triton's python backend (the GPU serving path, here with a CPU package): the sample
    request gets the PyTorch model's detections."""
    import numpy as np

    from yolov9.core.paths import SAMPLE_IMAGES as SAMPLES
    from yolov9.serve.detector import Detector, Request
    from yolov9.serve.stack import serve_once

    from .conftest import free_port

    ports = (free_port(), free_port(), free_port())
    body = serve_once(
        str(aoti_cpu_package), port=free_port(), img=160, conf=0.05, triton_ports=ports, repo=str(tmp_path)
    )
    data = sorted(SAMPLES.glob("*.jpg"))[0].read_bytes()
    ((dets, n),) = Detector(str(trained_tiny), device="cpu", img_size=160)([Request(data, conf=0.05)])
    got = np.array([d["box"] + [d["score"], d["class_id"]] for d in body["detections"]]).reshape(-1, 6)
    assert len(got) == n > 0
    np.testing.assert_allclose(got[:, :4], dets[:n, :4].numpy(), atol=0.05)
    np.testing.assert_array_equal(got[:, 5], dets[:n, 5].numpy())


def test_serve_by_its_path_without_the_venv_activated(checkpoint, tmp_path):
    """`/path/to/venv/bin/yolov9 serve` from a shell that never activated the venv: Triton's python backend still
    runs this interpreter's packages."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from .conftest import CONF, IMG, free_port

    exe = Path(sys.executable).parent / "yolov9"
    if not exe.exists():
        pytest.skip(f"no console script beside {sys.executable} (not an installed environment)")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(d for d in ("/usr/bin", "/bin") if os.path.isdir(d))
    ports = [str(free_port()) for _ in range(4)]
    cmd = [str(exe), "serve", "--weights", str(checkpoint), "--once", "--img", str(IMG), "--conf", str(CONF),
           "--port", ports[0], "--triton-http-port", ports[1], "--triton-grpc-port", ports[2],
           "--triton-metrics-port", ports[3]]  # fmt: skip
    assert shutil.which("python3", path=env["PATH"]) != sys.executable
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "detections in" in r.stdout and "logs in" in r.stdout


def test_a_model_that_fails_to_load_is_named_with_its_cause(checkpoint, tmp_path):
    from yolov9.serve.config import RepoConfig
    from yolov9.serve.repository import build_repo, read_config, write_config
    from yolov9.serve.triton_server import TritonError, TritonServer

    from .conftest import free_port

    d = build_repo(checkpoint, tmp_path / "repo", RepoConfig(kind="cpu", img=160))
    cfg = read_config(d)
    cfg.parameters["engine"].string_value = str(tmp_path / "gone.pt")
    write_config(d, cfg)
    srv = TritonServer(tmp_path / "repo", (free_port(), free_port(), free_port()), log_file=tmp_path / "t.log")
    with pytest.raises(TritonError) as e:
        srv.start(timeout=180, model="yolov9")
    msg = str(e.value)
    assert "model 'yolov9' failed to load:" in msg and "gone.pt" in msg and "\n" not in msg, msg
