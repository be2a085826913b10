"""`yolov9 bench engine`: images/s and latency per engine and batch size on random input."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import torch

from yolov9.core.checkpoint import load_model
from yolov9.core.device import synchronized_time
from yolov9.core.errors import BadInput, Unavailable
from yolov9.core.profiling import profile_calls
from yolov9.export.aoti import AOTIEngine
from yolov9.export.config import BenchEngineConfig
from yolov9.export.cuda_graph import CudaGraphEngine
from yolov9.export.onnx_export import OnnxEngine
from yolov9.export.torch_engine import TorchEngine


def _build(kind: str, weights: str, img: int, workdir: Path, max_batch: int, built: dict):
    """Engines are built once per base kind; '-graph' variants wrap the same engine in CUDA-graph replay."""
    graph = kind.endswith("-graph")
    base = kind.removesuffix("-graph")
    if base not in built:
        built[base] = _build_base(base, weights, img, workdir, max_batch)
    return CudaGraphEngine(built[base]) if graph else built[base]


def _build_base(base: str, weights: str, img: int, workdir: Path, max_batch: int):
    cuda = torch.cuda.is_available()
    if base == "onnx-cpu":
        from yolov9.export.onnx_export import export_onnx

        return OnnxEngine(export_onnx(weights, workdir / "bench.onnx", img=img))
    if not cuda:
        raise Unavailable("needs a CUDA GPU")
    if base in ("torch-fp32", "torch-fp16"):
        eng = TorchEngine(load_model(weights), "cuda", half=base == "torch-fp16", img_size=img)
    elif base == "aoti-fp16":
        from yolov9.export.aoti import export_aoti

        pt2 = (
            Path(weights)
            if weights.endswith(".pt2")
            else export_aoti(weights, workdir / "bench.pt2", img=img, max_batch=max_batch)
        )
        eng = AOTIEngine(pt2)
    elif base == "trt-fp16":
        from yolov9.export.onnx_export import export_onnx
        from yolov9.export.tensorrt import BuildProfile, TensorRTEngine, build_engine, import_tensorrt, needs_fp16_onnx

        import_tensorrt()
        onnx = export_onnx(weights, workdir / "bench_trt.onnx", img=img, half=needs_fp16_onnx())
        profile = BuildProfile(1, max_batch // 2, max_batch)
        eng = TensorRTEngine(build_engine(onnx, workdir / "bench.plan", profile))
    else:
        raise BadInput(f"unknown engine '{base}'")
    return eng


def seconds_per_call(fn, arg, warmup: int, iters: int, device: torch.device) -> float:
    """Mean wall time of fn(arg) after `warmup` untimed calls; CUDA work is waited for at both ends."""
    for _ in range(warmup):
        fn(arg)
    t = synchronized_time(device)
    for _ in range(iters):
        fn(arg)
    return (synchronized_time(device) - t) / iters


def bench_engines(args: BenchEngineConfig) -> list[dict]:
    batches = list(args.batches)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows, built = [], {}
    for kind in args.engines.split(","):
        try:
            t0 = time.time()
            eng = _build(kind, args.weights, args.img, workdir, max(batches), built)
            build_s = time.time() - t0
        except (RuntimeError, ImportError) as e:
            print(json.dumps({"engine": kind, "skipped": str(e).splitlines()[0]}))
            rows.append({"engine": kind, "skipped": str(e).splitlines()[0]})
            continue
        for b in batches:
            x = torch.rand(b, 3, args.img, args.img, device=eng.device).to(eng.dtype)
            el = seconds_per_call(eng, x, args.warmup, args.iters, eng.device)
            row = {
                "engine": kind,
                "batch": b,
                "img": args.img,
                "images_per_s": round(b / el, 1),
                "ms_per_batch": round(el * 1000, 3),
                "build_s": round(build_s, 1),
                "device": torch.cuda.get_device_name() if eng.device.type == "cuda" else "cpu",
            }
            if args.profile and eng.device.type == "cuda":
                with open(args.profile, "a") as f:
                    f.write(f"== {kind}, batch {b}\n")
                row.update(profile_calls(functools.partial(eng, x), 10, eng.device, args.profile))
            print(json.dumps(row))
            rows.append(row)
        del eng
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return rows
