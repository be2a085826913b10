"""The serving commands' options as dataclasses (the command line is generated from them, core/options.py), so each
is callable from Python: the model repository (`RepoConfig`), `loadtest` (`LoadtestConfig`) and `bench detector`
(`BenchDetectorConfig`). Torch-free, so `--help` is fast."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

from yolov9.core.detection_defaults import CONF, IOU, MAX_DET, require_thresholds
from yolov9.core.errors import BadInput
from yolov9.core.options import int_list, option, require_at_least
from yolov9.core.paths import SAMPLE_IMAGES

# core/decode.py's decoders (named here too: this module stays torch-free for a fast --help)
Decoder = Literal["auto", "nvimgcodec", "nvjpeg", "cpu"]
DECODER: Decoder = "auto"  # the default of build-repo, bench detector, the Detector and a repository without it
DECODER_HELP = (
    DECODER,
    "JPEG decoder: auto takes nvjpeg (torchvision, on the CUDA cores) on a GPU and cpu elsewhere; nvimgcodec uses "
    "the GPU's hardware JPEG engines (pip install yolov9-trt[gpu]); one that cannot run falls back along nvimgcodec, "
    "nvjpeg, cpu",
)

# core/device.to_host's waits
GpuWait = Literal["block", "spin"]
GPU_WAIT: GpuWait = "spin"  # the default of build-repo, bench detector, the Detector and a repository without it
GPU_WAIT_HELP = (
    GPU_WAIT,
    "how a GPU instance waits for its batch's results: spin polls on its core (CUDA's default); block sleeps on a "
    "CUDA event, which takes about half the stubs' CPU, leaving cores to Triton and the gateway, but in the full "
    "stack served fewer images/s at light and medium loads and was level or ahead only at the heaviest "
    "(docs/benchmarks.md)",
)

LOAD_TIMEOUT_S = 600.0  # deploy/rollback: how long one server may take to load a version before the roll-out stops


def batch_sizes(text: str) -> list[int]:
    """--preferred-batch: a comma list of sizes, or 'none' (an empty list)."""
    if text.strip().lower() == "none":
        return []
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of integers or 'none'") from None


@dataclass
class RepoConfig:
    """How the model repository serves an engine: Triton's batcher, the model instances and the output size."""

    name: str = option("yolov9", "model name in the repository")
    max_batch: int = option(
        32,
        "Triton max_batch_size (under MPS the longest batches set the tail latency, and capping them at 32 served "
        "as much at a lower p99; docs/benchmarks.md)",
    )
    queue_delay_us: int = option(
        0,
        "dynamic batching: how long (0-2000 us) a request waits for others to share its batch; with 0 a free "
        "instance takes what is queued at once (requests that queue while the instances are busy still batch, and "
        "on the project's H200 0 served more at a lower p99 than 200 or 1000 at every load; docs/benchmarks.md)",
    )
    preferred_batch: list[int] | None = option(
        None,
        "comma list of batch sizes Triton's batcher cuts batches at when it can, or 'none' to send whatever is "
        "queued (default 4,8,16,32,64 up to --max-batch)",
        type=batch_sizes,
        metavar="SIZES",
    )
    instances: int = option(
        2,
        "model instances (processes). With one, Triton's batcher can leave a request queued for half a second when "
        "it arrives while that instance is finishing the previous batch; several share one GPU best under `serve "
        "triton --mps` (docs/benchmarks.md)",
    )
    kind: Literal["auto", "gpu", "cpu"] = option("auto", "instance kind")
    max_det: int = option(MAX_DET, "detections per image (fixed output size)")
    img: int | None = option(None, "inference size (default: the engine's)")
    cuda_graphs: bool = option(
        True, "GPU instances replay one CUDA graph per batch bucket (--no-cuda-graphs: the engine kernel by kernel)"
    )
    decoder: Decoder = option(DECODER_HELP[0], DECODER_HELP[1])
    gpu_wait: GpuWait = option(GPU_WAIT_HELP[0], GPU_WAIT_HELP[1])
    max_queue: int = option(1024, "requests Triton queues per model before it refuses more")
    trt_variant: bool = option(False, "also write the tensorrt_plan ensemble (pre -> plan -> post) for NGC Triton")
    copy_engine: bool = option(
        True, "copy the engine file into the repository (else refer to it where it is)", cli=False
    )

    def __post_init__(self):
        require_at_least(self, dict(max_batch=1, instances=1, max_det=1, img=32, max_queue=1))


@dataclass
class LoadtestConfig:
    """`yolov9 loadtest`: real images against one URL, closed-loop steps or an open-loop rate."""

    target: Literal["gateway", "triton"] = option("gateway", "what URL points at")
    url: str | None = option(
        None,
        "gateway base URL or Triton gRPC host:port (default: http://127.0.0.1:8080 for the gateway, 127.0.0.1:8001 "
        "for Triton)",
    )
    images: str = option(str(SAMPLE_IMAGES), "folder of images to send (cycled)")
    concurrency: list[int] = option(
        factory=lambda: [1, 8, 32], help="comma list: closed-loop sweep steps", type=int_list
    )
    rate: float | None = option(None, "open-loop requests/s instead of a concurrency sweep")
    duration: float = option(10.0, "seconds per step (after warm-up)")
    requests: int | None = option(None, "stop a step after this many measured requests (warm-up ones not counted)")
    warmup: float = option(2.0, "seconds of warm-up per step, not counted")
    procs: int = option(
        1, "client processes sharing the load; a step's concurrency is the total in flight, so at most that many run"
    )
    model: str = option("yolov9", "Triton model name (target triton)")
    conf: float = option(CONF, "score threshold sent with each request")
    timeout: float = option(30.0, "per-request timeout in seconds")
    plot: list[str] | None = option(
        None,
        "send nothing: draw these saved results on one chart (written to --out with .png)",
        nargs="+",
        metavar="RESULT_JSON",
        type=str,
    )
    triton_metrics: str | None = option(
        None,
        "Triton metrics URL to scrape: its queue and compute time and batch size, and the model instances' time "
        "per image by stage (instance_ms_per_image)",
    )
    timeline: bool = option(
        False, "also write requests and errors per second over the run (for failover and roll-out runs) as PNG"
    )
    out: str = option("loadtest.json", "results JSON (CSV and PNG are written beside it)")

    def __post_init__(self):
        require_at_least(self, dict(procs=1, requests=1))
        if min(self.concurrency, default=1) < 1:
            raise BadInput(f"--concurrency {','.join(map(str, self.concurrency))}: each step needs at least 1")
        for name in ("duration", "timeout", "rate"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise BadInput(f"--{name} {getattr(self, name)}: must be above 0")
        require_thresholds(self.conf, IOU, MAX_DET)


@dataclass
class BenchDetectorConfig:
    """`yolov9 bench detector`: one Triton batch's serving computation on real images, no server."""

    engine: str = option(help="engine file (.pt2, .onnx, .plan), checkpoint or zoo name", positional=True)
    images: str = option(str(SAMPLE_IMAGES), "folder of images (cycled to fill each batch)")
    batches: list[int] = option(factory=lambda: [1, 8, 32, 64], help="comma list of batch sizes", type=int_list)
    img: int = option(640, "inference size")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    conf: float = option(CONF, "score threshold of the requests")
    iters: int = option(20, "timed batches per size")
    warmup: int = option(3, "untimed batches per size")
    cuda_graphs: bool = option(True, "run the engine with CUDA-graph buckets (--no-cuda-graphs: without)")
    decoder: Decoder = option(DECODER_HELP[0], DECODER_HELP[1])
    gpu_wait: GpuWait = option(GPU_WAIT_HELP[0], GPU_WAIT_HELP[1])
    letterbox_kernel: bool = option(
        True,
        "on a GPU, letterbox the whole batch in one Triton kernel (--no-letterbox-kernel: one resize per image size, "
        "the reference path, to compare)",
    )
    procs: int = option(
        1,
        "run it in this many processes at once (as that many Triton instances would) and report their combined "
        "images/s, without the per-stage split",
    )
    mps: bool = option(False, "with --procs: run the processes under a CUDA MPS daemon")
    out: str | None = option(None, "write the rows as JSON here")


@dataclass
class BenchGatewayConfig:
    """`yolov9 bench gateway`: the gateway alone against a stand-in Triton that answers at once (serve/stub_triton.py):
    requests/s and CPU per request of its workers, on any machine."""

    images: str = option(str(SAMPLE_IMAGES), "folder of images to send (cycled)")
    concurrency: list[int] = option(factory=lambda: [8, 32], help="comma list: closed-loop steps", type=int_list)
    duration: float = option(5.0, "seconds per step (after warm-up)")
    warmup: float = option(1.0, "seconds of warm-up per step, not counted")
    workers: int = option(1, "gateway worker processes")
    procs: int = option(1, "client processes")
    delay_ms: float = option(0.0, "how long the stand-in takes per inference (an await: no CPU)")
    direct: bool = option(
        True,
        "before each gateway step, the same load straight at the stand-in's gRPC port: the rows then say what the "
        "gateway adds (added_p50_ms, gateway_vs_direct); --no-direct measures the gateway alone",
    )
    profile: str | None = option(None, "also profile each worker (cProfile) and write its top functions here (.txt)")
    out: str | None = option(None, "write the rows as JSON here")
