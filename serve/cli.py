"""Subcommands of the serving side: `serve` (Triton + gateway together), `serve build-repo|triton|gateway`,
and `loadtest`."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

from yolov9.core.detection_defaults import CONF
from yolov9.core.errors import BadInput, Unavailable
from yolov9.core.options import add_options, from_namespace
from yolov9.serve.config import LOAD_TIMEOUT_S, BenchDetectorConfig, BenchGatewayConfig, LoadtestConfig, RepoConfig

REPO = "model_repository"


def _add_triton_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--triton-http-port", type=int, default=8000, help="Triton HTTP port")
    p.add_argument("--triton-grpc-port", type=int, default=8001, help="Triton gRPC port")
    p.add_argument("--triton-metrics-port", type=int, default=8002, help="Triton metrics port")
    p.add_argument(
        "--mps",
        action="store_true",
        help="run the GPU model instances under a private CUDA MPS daemon, so several instances share the GPU "
        "at once instead of time-slicing it (needs nvidia-cuda-mps-control; measurements in docs/benchmarks.md)",
    )


def _cmd_build_repo(args: argparse.Namespace) -> None:
    from yolov9.serve.repository import build_repo

    d = build_repo(args.engine, args.repo, from_namespace(RepoConfig, args))
    print(f"wrote {d}")


def _interrupt(signum, frame):
    # later signals (a `timeout` wrapper forwards its own SIGTERM too) must not cut the servers' shutdown short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _wait_forever(*procs) -> None:
    """Until Ctrl-C or SIGTERM; a server that exits by itself ends the command with an error (a non-zero exit)."""
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the servers as cleanly as Ctrl-C does
    try:
        while all(p.running() for p in procs):
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("stopping")
        return
    dead = next(p for p in procs if not p.running())
    from yolov9.serve.triton_server import exit_cause

    cause = exit_cause(dead.proc.returncode, getattr(dead, "log_file", None))
    raise Unavailable(f"{type(dead).__name__} exited with code {dead.proc.returncode}: {cause}")


def _serve_until_stopped(server, message: str) -> None:
    print(f"{message} (Ctrl-C stops)")
    try:
        _wait_forever(server)
    finally:
        server.stop()


def _triton_server(args: argparse.Namespace, log_file: str | Path | None):
    """The Triton server the serve options describe (repository, ports, host)."""
    from yolov9.serve.deploy import serving_model
    from yolov9.serve.triton_server import TritonServer

    ports = (args.triton_http_port, args.triton_grpc_port, args.triton_metrics_port)
    explicit = ["--model-control-mode=explicit", f"--load-model={serving_model(args.repo, args.name)}"]
    return TritonServer(args.repo, ports, args.host, log_file, explicit, args.mps)


def _cmd_triton(args: argparse.Namespace) -> None:
    from yolov9.serve.deploy import serving_model

    srv = _triton_server(args, args.log)
    srv.start(args.timeout, model=serving_model(args.repo, args.name))
    _serve_until_stopped(srv, f"Triton ready: gRPC {srv.grpc_url}, HTTP {srv.http_url}, metrics {srv.metrics_url}")


def _cmd_gateway(args: argparse.Namespace) -> None:
    import os

    from yolov9.serve.gateway.process import GatewayProcess

    urls = (args.triton or os.environ.get("YOLOV9_TRITON_URLS") or "127.0.0.1:8001").split(",")
    settings = {
        k: getattr(args, k) for k in ("max_upload_bytes", "header_timeout_s", "body_timeout_s", "max_connections")
    }
    gw = GatewayProcess(urls, args.host, args.port, args.workers, model=args.name, repo=args.repo, **settings)
    gw.start()
    _serve_until_stopped(gw, f"gateway on {gw.url} (docs at {gw.url}/docs), Triton at {args.triton}")


def _cmd_serve(args: argparse.Namespace) -> None:
    """Triton and the gateway together on the given weights or engine."""
    from yolov9.serve.stack import ServingStack, StackConfig, answer_once

    if not args.weights:
        raise BadInput("give --weights (a checkpoint, zoo name or engine file), or a subcommand")
    ports = (args.triton_http_port, args.triton_grpc_port, args.triton_metrics_port)
    repo = None if args.once and args.repo == REPO else args.repo  # --once leaves the served repository alone
    cfg = StackConfig(
        args.weights, repo, args.host, args.port, args.workers, ports, args.mps, args.timeout,
        from_namespace(RepoConfig, args), args.servers, args.restarts,
    )  # fmt: skip
    if args.once:
        answer_once(cfg, args.conf)
        return
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the stack as cleanly as Ctrl-C does
    try:
        with ServingStack(cfg) as stack:
            grpc = ", ".join(s.grpc_url for s in stack.tritons)
            print(
                f"serving {args.weights}: gateway {stack.url} (page {stack.url}/, docs {stack.url}/docs), Triton {grpc}"
            )
            print("Ctrl-C stops; a crashed Triton is restarted", flush=True)
            stack.supervise()
    except KeyboardInterrupt:
        print("stopping")


def _cmd_deploy(args: argparse.Namespace) -> None:
    """A new version without downtime: through a gateway's admin endpoint, or directly on a repository and its
    Triton servers."""
    import json

    if args.gateway and getattr(args, "keep", None) is not None:
        raise BadInput("--keep: a gateway's roll-outs keep its repository's default; use it with --repo")
    if args.gateway:
        import httpx

        headers = {"X-API-Key": args.api_key} if args.api_key else {}
        path = "rollback" if args.rollback else "deploy"
        params = {"load_timeout_s": args.load_timeout}
        if not args.rollback:
            params["engine"] = str(Path(args.engine).resolve())
        timeout = 2 * args.load_timeout + 300  # a load per server (two is the common case), the drain and the rest
        r = httpx.post(f"{args.gateway.rstrip('/')}/v1/admin/{path}", params=params, headers=headers, timeout=timeout)
        if r.status_code != 200:
            detail = r.json().get("detail", r.text) if r.headers.get("content-type") == "application/json" else r.text
            raise BadInput(f"{args.gateway}: {path} refused (HTTP {r.status_code}): {detail}")
        print(json.dumps(r.json()))
        return
    from yolov9.serve.deploy import deploy, rollback

    urls = args.triton.split(",")
    if args.rollback:
        out = rollback(args.repo, args.name, urls, load_timeout_s=args.load_timeout)
    else:
        keep = {} if args.keep is None else {"keep": args.keep}
        out = deploy(args.engine, args.repo, args.name, urls, load_timeout_s=args.load_timeout, **keep)
    print(json.dumps(out), flush=True)  # the result is out before the interpreter's exit, whatever happens there


def _loadtest(args: argparse.Namespace) -> None:
    from yolov9.serve.loadtest import run_loadtest

    run_loadtest(from_namespace(LoadtestConfig, args))


def _cmd_bench_detector(args: argparse.Namespace) -> None:
    from yolov9.serve.bench import bench_detector

    bench_detector(from_namespace(BenchDetectorConfig, args))


def _cmd_bench_gateway(args: argparse.Namespace) -> None:
    from yolov9.serve.bench_gateway import bench_gateway

    bench_gateway(from_namespace(BenchGatewayConfig, args))


def register(sub, bench) -> None:
    s = sub.add_parser(
        "serve",
        help="serve a model: Triton + FastAPI gateway (or one part: see subcommands)",
        description="With --weights: build the model repository, start Triton and the gateway, "
        "and serve until Ctrl-C (or answer one request with --once).",
        allow_abbrev=False,  # else `serve gateway --triton X` reads as an abbreviation of --triton-grpc-port etc.
    )
    s.add_argument("--weights", default=None, help="checkpoint, zoo name or engine file (.onnx, .pt2, .plan)")
    s.add_argument("--host", default="127.0.0.1", help="address the gateway and Triton bind to")
    s.add_argument("--port", type=int, default=8080, help="gateway port")
    s.add_argument(
        "--workers", type=int, default=1, help="gateway worker processes (on Linux each gets its own listening socket)"
    )
    s.add_argument("--once", action="store_true", help="answer one request with a sample image, then stop")
    s.add_argument("--conf", type=float, default=CONF, help="--once: score threshold of the sample request")
    s.add_argument("--timeout", type=float, default=300, help="seconds to wait for Triton to be ready")
    s.add_argument("--repo", default=REPO, help="model repository folder")
    s.add_argument(
        "--servers",
        type=int,
        default=1,
        help="Triton servers behind the gateway (server k on the first's ports + 10 k; one per GPU where there "
        "are several)",
    )
    s.add_argument(
        "--restarts", type=int, default=5, help="crashes in a row of one Triton that are restarted before serve stops"
    )
    _add_triton_server_args(s)
    add_options(s, RepoConfig, skip=("trt_variant",))
    s.set_defaults(func=_cmd_serve)
    ss = s.add_subparsers(dest="serve_cmd", metavar="PART")

    p = ss.add_parser("build-repo", help="fill the Triton model repository for an engine")
    p.add_argument("--engine", required=True, help="engine file (.onnx, .pt2, .plan), checkpoint or zoo name")
    p.add_argument("--repo", default=REPO, help="model repository folder")
    add_options(p, RepoConfig)
    p.set_defaults(func=_cmd_build_repo)

    p = ss.add_parser("triton", help="start Triton on the repository and wait until the model is ready")
    p.add_argument("--repo", default=REPO, help="model repository folder")
    p.add_argument("--name", default="yolov9", help="model to wait for")
    p.add_argument("--host", default="127.0.0.1", help="bind address")
    p.add_argument("--log", default=None, help="write Triton's log here")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for readiness")
    _add_triton_server_args(p)
    p.set_defaults(func=_cmd_triton)

    p = ss.add_parser("gateway", help="start the FastAPI gateway (uvicorn) in front of Triton")
    p.add_argument(
        "--triton",
        default=None,
        help="comma list of Triton gRPC endpoints: requests go to the healthy one with the fewest outstanding, a "
        "failed one is retried once on another (default: $YOLOV9_TRITON_URLS, else 127.0.0.1:8001)",
    )
    p.add_argument("--repo", default=None, help="the model repository, for deploy and rollback through /v1/admin")
    p.add_argument("--header-timeout-s", type=float, default=10.0, help="408 for a request whose headers take longer")
    p.add_argument("--body-timeout-s", type=float, default=60.0, help="408 for a request body that takes longer")
    p.add_argument(
        "--max-connections", type=int, default=1024, help="open connections per worker; beyond it 503 and close"
    )
    p.add_argument("--name", default="yolov9", help="Triton model name")
    p.add_argument("--host", default="127.0.0.1", help="bind address")
    p.add_argument("--port", type=int, default=8080, help="port")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="uvicorn worker processes; on Linux each gets its own SO_REUSEPORT socket, so the kernel spreads "
        "connections evenly (one shared socket let a few workers take most keep-alive connections)",
    )
    p.add_argument("--max-upload-bytes", type=int, default=20 * 2**20, help="largest accepted image")
    p.set_defaults(func=_cmd_gateway)

    for cmd, text in (("deploy", "roll a new version of the model out without downtime"),
                      ("rollback", "go back to the version served before the current one")):  # fmt: skip
        p = ss.add_parser(
            cmd,
            help=text,
            description="Each version is its own Triton model in the repository (<name>__v<k>), loaded beside the "
            "served one; the gateway moves new requests to it once it answers, and the old one is unloaded after "
            "the requests it holds. A model whose classes, image size or outputs differ is refused first.",
        )
        if cmd == "deploy":
            p.add_argument("engine", help="checkpoint or engine file to serve next")
            p.add_argument("--keep", type=int, default=None, help="without --gateway: versions kept for rollback, "
                           "the new one included (default: 3); older version folders are removed once unloaded, "
                           "the built model's never")  # fmt: skip
        p.add_argument("--gateway", default=None, help="a running gateway's URL: it deploys on its repository")
        p.add_argument("--api-key", default=None, help="--gateway: its X-API-Key")
        p.add_argument("--repo", default=REPO, help="without --gateway: the model repository")
        p.add_argument("--name", default="yolov9", help="without --gateway: the model")
        p.add_argument("--triton", default="127.0.0.1:8001", help="without --gateway: comma list of Triton gRPC URLs")
        p.add_argument("--load-timeout", type=float, default=LOAD_TIMEOUT_S, help="seconds each server may take to "
                       "load the version; past it the roll-out stops with an error, the served version stays and the "
                       "late one is unloaded once Triton has loaded it")  # fmt: skip
        p.set_defaults(func=_cmd_deploy, rollback=cmd == "rollback", engine=None)

    s = sub.add_parser(
        "loadtest",
        help="load-test the gateway or Triton (concurrency sweep or open-loop rate)",
        description="Send real images to URL and report throughput, latency percentiles and errors. "
        "Only the given URL is targeted; the default is loopback.",
    )
    add_options(s, LoadtestConfig)
    s.set_defaults(func=_loadtest)

    s = bench.add_parser(
        "detector",
        help="the serving computation per batch (decode, letterbox, engine, NMS) on real images, no server",
        description="Runs what one Triton model instance runs for a batch of encoded images and reports "
        "images/s per batch size and the share of time per stage.",
    )
    add_options(s, BenchDetectorConfig)
    s.set_defaults(func=_cmd_bench_detector)

    s = bench.add_parser(
        "gateway",
        help="the gateway alone (requests/s, CPU per request) against a stand-in Triton that answers at once",
        description="Starts a stand-in Triton (serve/stub_triton.py) and the gateway on loopback, sends real images "
        "at each concurrency and reports requests/s, latency and the gateway workers' CPU milliseconds per request.",
    )
    add_options(s, BenchGatewayConfig)
    s.set_defaults(func=_cmd_bench_gateway)
