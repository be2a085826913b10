"""Subcommands of the serving side: `serve` (Triton + gateway together), `serve build-repo|triton|gateway`,
and `loadtest`."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

from yolov9.core.errors import BadInput
from yolov9.core.paths import SAMPLE_IMAGES as SAMPLES

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


def _batch_sizes(text: str) -> list[int]:
    if text.strip().lower() == "none":
        return []
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of integers or 'none'") from None


def _add_repo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo", default=REPO, help="model repository folder")
    p.add_argument("--name", default="yolov9", help="model name in the repository")
    p.add_argument(
        "--max-batch",
        type=int,
        default=32,
        help="Triton max_batch_size (default 32: under MPS the longest batches set the tail latency, and capping "
        "them at 32 served as much at a lower p99; docs/benchmarks.md)",
    )
    p.add_argument("--queue-delay-us", type=int, default=500, help="dynamic batching queue delay (100-2000 us)")
    p.add_argument(
        "--preferred-batch",
        type=_batch_sizes,
        default=None,
        metavar="SIZES",
        help="comma list of batch sizes Triton's batcher cuts batches at when it can, or 'none' to send whatever "
        "is queued (default 4,8,16,32,64 up to --max-batch)",
    )
    p.add_argument(
        "--instances",
        type=int,
        default=1,
        help="model instances (processes); several share one GPU best under `serve triton --mps` (docs/benchmarks.md)",
    )
    p.add_argument("--kind", default="auto", choices=["auto", "gpu", "cpu"], help="instance kind")
    p.add_argument("--max-det", type=int, default=100, help="detections per image (fixed output size)")
    p.add_argument("--img", type=int, default=None, help="inference size (default: the engine's)")
    p.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="GPU instances run the engine kernel by kernel instead of replaying one CUDA graph per batch bucket",
    )


def _repo_options(args: argparse.Namespace) -> dict:
    """The build_repo keywords the repository options describe."""
    return dict(
        max_batch=args.max_batch,
        preferred=args.preferred_batch,
        queue_delay_us=args.queue_delay_us,
        instances=args.instances,
        kind=args.kind,
        max_det=args.max_det,
        img_size=args.img,
        cuda_graphs=not args.no_cuda_graphs,
        trt_variant=getattr(args, "trt_variant", False),
    )


def _cmd_build_repo(args: argparse.Namespace) -> None:
    from yolov9.serve.repository import build_repo

    d = build_repo(args.engine, args.repo, args.name, **_repo_options(args))
    print(f"wrote {d}")


def _interrupt(signum, frame):
    # later signals (a `timeout` wrapper forwards its own SIGTERM too) must not cut the servers' shutdown short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _wait_forever(*procs) -> None:
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the servers as cleanly as Ctrl-C does
    try:
        while all(p.running() for p in procs):
            time.sleep(0.5)
        print("a server process exited; stopping")
    except KeyboardInterrupt:
        print("stopping")


def _serve_until_stopped(server, message: str) -> None:
    print(f"{message} (Ctrl-C stops)")
    try:
        _wait_forever(server)
    finally:
        server.stop()


def _triton_server(args: argparse.Namespace, log_file: str | Path | None):
    """The Triton server the serve options describe (repository, ports, host)."""
    from yolov9.serve.triton_server import TritonServer

    return TritonServer(
        args.repo,
        args.triton_http_port,
        args.triton_grpc_port,
        args.triton_metrics_port,
        host=args.host,
        log_file=log_file,
        mps=args.mps,
    )


def _cmd_triton(args: argparse.Namespace) -> None:
    srv = _triton_server(args, args.log)
    srv.start(args.timeout, model=args.name)
    _serve_until_stopped(srv, f"Triton ready: gRPC {srv.grpc_url}, HTTP {srv.http_url}, metrics {srv.metrics_url}")


def _cmd_gateway(args: argparse.Namespace) -> None:
    from yolov9.serve.gateway.process import GatewayProcess

    gw = GatewayProcess(
        args.triton.split(","), args.host, args.port, args.workers, args.name, max_upload_bytes=args.max_upload_bytes
    )
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
        args.weights, repo, args.name, args.host, args.port, args.workers, ports, args.mps, args.timeout,
        _repo_options(args),
    )  # fmt: skip
    if args.once:
        answer_once(cfg, args.conf)
        return
    with ServingStack(cfg) as stack:
        print(
            f"serving {args.weights}: gateway {stack.url} (docs {stack.url}/docs), Triton gRPC {stack.triton.grpc_url}"
        )
        _wait_forever(stack.triton, stack.gateway)


def _loadtest(args: argparse.Namespace) -> None:
    from yolov9.serve.loadtest import run_loadtest

    run_loadtest(args)


def _cmd_bench_detector(args: argparse.Namespace) -> None:
    from yolov9.serve.bench import bench_detector

    bench_detector(args)


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
    s.add_argument("--conf", type=float, default=0.25, help="--once: score threshold of the sample request")
    s.add_argument("--timeout", type=float, default=300, help="seconds to wait for Triton to be ready")
    _add_triton_server_args(s)
    _add_repo_args(s)
    s.set_defaults(func=_cmd_serve)
    ss = s.add_subparsers(dest="serve_cmd", metavar="PART")

    p = ss.add_parser("build-repo", help="fill the Triton model repository for an engine")
    p.add_argument("--engine", required=True, help="engine file (.onnx, .pt2, .plan), checkpoint or zoo name")
    p.add_argument(
        "--trt-variant",
        action="store_true",
        help="also write the tensorrt_plan ensemble (pre -> plan -> post) for NGC Triton",
    )
    _add_repo_args(p)
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
    p.add_argument("--triton", default="127.0.0.1:8001", help="comma list of Triton gRPC endpoints")
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

    s = sub.add_parser(
        "loadtest",
        help="load-test the gateway or Triton (concurrency sweep or open-loop rate)",
        description="Send real images to URL and report throughput, latency percentiles and errors. "
        "Only the given URL is targeted; the default is loopback.",
    )
    s.add_argument("--target", choices=["gateway", "triton"], default="gateway", help="what URL points at")
    s.add_argument(
        "--url",
        default=None,
        help="gateway base URL or Triton gRPC host:port (default: http://127.0.0.1:8080 for the gateway, "
        "127.0.0.1:8001 for Triton)",
    )
    s.add_argument("--images", default=str(SAMPLES), help="folder of images to send (cycled)")
    s.add_argument("--concurrency", default="1,8,32", help="comma list: closed-loop sweep steps")
    s.add_argument("--rate", type=float, default=None, help="open-loop requests/s instead of a concurrency sweep")
    s.add_argument("--duration", type=float, default=10.0, help="seconds per step (after warm-up)")
    s.add_argument(
        "--requests",
        type=int,
        default=None,
        help="stop a step after this many measured requests (warm-up ones not counted)",
    )
    s.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up per step, not counted")
    s.add_argument("--procs", type=int, default=1, help="client processes sharing the load")
    s.add_argument("--model", default="yolov9", help="Triton model name (target triton)")
    s.add_argument("--conf", type=float, default=0.25, help="score threshold sent with each request")
    s.add_argument("--timeout", type=float, default=30.0, help="per-request timeout in seconds")
    s.add_argument(
        "--plot",
        nargs="+",
        default=None,
        metavar="RESULT_JSON",
        help="send nothing: draw these saved results on one chart (written to --out with .png)",
    )
    s.add_argument("--triton-metrics", default=None, help="Triton metrics URL to scrape (queue/compute time, batch)")
    s.add_argument("--out", default="loadtest.json", help="results JSON (CSV and PNG are written beside it)")
    s.set_defaults(func=_loadtest)

    s = bench.add_parser(
        "detector",
        help="the serving computation per batch (decode, letterbox, engine, NMS) on real images, no server",
        description="Runs what one Triton model instance runs for a batch of encoded images and reports "
        "images/s per batch size and the share of time per stage.",
    )
    s.add_argument("engine", help="engine file (.pt2, .onnx, .plan), checkpoint or zoo name")
    s.add_argument("--images", default=str(SAMPLES), help="folder of images (cycled to fill each batch)")
    s.add_argument("--batches", default="1,8,32,64", help="comma list of batch sizes")
    s.add_argument("--img", type=int, default=640, help="inference size")
    s.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    s.add_argument("--conf", type=float, default=0.25, help="score threshold of the requests")
    s.add_argument("--iters", type=int, default=20, help="timed batches per size")
    s.add_argument("--warmup", type=int, default=3, help="untimed batches per size")
    s.add_argument("--no-cuda-graphs", action="store_true", help="run the engine without CUDA-graph buckets")
    s.add_argument(
        "--procs",
        type=int,
        default=1,
        help="run it in this many processes at once (as that many Triton instances would) and report their "
        "combined images/s, without the per-stage split",
    )
    s.add_argument("--mps", action="store_true", help="with --procs: run the processes under a CUDA MPS daemon")
    s.add_argument("--out", default=None, help="write the rows as JSON here")
    s.set_defaults(func=_cmd_bench_detector)
