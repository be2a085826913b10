"""`yolov9 bench detector`: the whole serving computation of one Triton batch (decode, letterbox, engine, NMS)
on real encoded images, per batch size, with the time split by stage. No server: this is the ceiling the
python-backend model can reach per instance. With --procs K, K processes (as K Triton instances are) run it at
once and the row gives their combined rate; --mps runs them under a CUDA MPS daemon."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from yolov9.core.errors import Unavailable
from yolov9.core.preprocess import letterbox_path
from yolov9.export.bench import seconds_per_call
from yolov9.serve.config import BenchDetectorConfig
from yolov9.serve.detector import Detector, Request, thread_share
from yolov9.serve.loadtest import load_images


def bench_detector(args: BenchDetectorConfig) -> list[dict]:
    batches = list(args.batches)
    rows = []
    for row in _bench_processes(args, batches) if args.procs > 1 or args.mps else _bench_one(args, batches):
        print(json.dumps(row))  # each batch size as it finishes
        rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return rows


def _detector(args, batches: list[int]) -> Detector:
    det = Detector(
        args.engine,
        device=args.device,
        img_size=args.img,
        cuda_graphs=args.cuda_graphs,
        max_batch=max(batches),
        decoder=args.decoder,
    )
    det.letterbox_kernel, det.gpu_wait = args.letterbox_kernel, args.gpu_wait
    det.warmup()
    return det


def _requests(args, blobs: list[bytes], b: int, offset: int = 0) -> list[Request]:
    return [Request(blobs[(offset + i) % len(blobs)], conf=args.conf) for i in range(b)]


def _bench_one(args, batches: list[int]) -> Iterator[dict]:
    blobs = load_images(args.images)
    det = _detector(args, batches)
    for b in batches:
        reqs = _requests(args, blobs, b)
        cpu = time.process_time()
        el = seconds_per_call(det, reqs, args.warmup, args.iters, det.device)
        cpu = (time.process_time() - cpu) / (args.warmup + args.iters)  # the process's CPU seconds per batch
        stages: dict[str, float] = {}
        for _ in range(max(args.iters // 4, 1)):  # a separate, synchronised pass for the split
            results = det(reqs, timings=stages)
        total = sum(stages.values())
        passes = max(args.iters // 4, 1)
        # NMS work grows with the boxes over the threshold: candidates before NMS, detections after
        candidates = det.predict(reqs).candidates[-1, 0].item() / b  # the step counts them all
        detections = sum(r[1] for r in results if not isinstance(r, Exception)) / b
        row = {
            "engine": args.engine,
            "kind": det.engine.kind + ("+graphs" if det.buckets else ""),
            "batch": b,
            "images_per_s": round(b / el, 1),
            "ms_per_batch": round(el * 1000, 2),
            "cpu_ms_per_image": round(1000 * cpu / b, 3),
            "decoder": det.decoder.name,
            "gpu_wait": args.gpu_wait,
            "letterbox": letterbox_path(b, det.device, args.letterbox_kernel),
            "stage_share": {k: round(v / total, 3) for k, v in stages.items()},
            "stage_ms": {k: round(1000 * v / passes, 2) for k, v in stages.items()},
            "candidates_per_image": round(candidates, 1),
            "detections_per_image": round(detections, 2),
            "device": torch.cuda.get_device_name() if det.device.type == "cuda" else "cpu",
        }
        yield row


def _bench_processes(args, batches: list[int]) -> list[dict]:
    """K processes, each with its own Detector, start each batch size together after a barrier; images/s is the
    work of all K over the slowest one's time."""
    from yolov9.serve.mps import MpsDaemon

    rows = []
    with MpsDaemon() if args.mps else contextlib.nullcontext() as mps:
        if mps is not None:  # children inherit the environment: they find the daemon when they open CUDA
            os.environ.update(mps.env)
        ctx = mp.get_context("spawn")  # each child opens CUDA itself, as a Triton instance does
        barrier, results = ctx.Barrier(args.procs), ctx.Queue()
        procs = [ctx.Process(target=_child, args=(args, batches, barrier, results)) for _ in range(args.procs)]
        for p in procs:
            p.start()
        per_child = []
        while len(per_child) < len(procs):
            try:
                per_child.append(results.get(timeout=1))
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:  # a crashed child never reports: stop the rest instead of waiting at their barrier
                    for p in procs:
                        p.terminate()
                    raise Unavailable(f"bench detector --procs: a process exited with code {dead[0]}") from None
        for p in procs:
            p.join()
        if mps is not None:
            for key in mps.env:
                os.environ.pop(key, None)
    for b in batches:
        done = [c[b] for c in per_child]
        if any(isinstance(d, str) for d in done):
            raise Unavailable(
                f"bench detector --procs: a process failed: {next(d for d in done if isinstance(d, str))}"
            )
        wall, cpu = max(d[0] for d in done), sum(d[1] for d in done)
        row = {
            "engine": args.engine,
            "procs": args.procs,
            "mps": args.mps,
            "batch": b,
            "images_per_s": round(args.procs * args.iters * b / wall, 1),
            "cpu_ms_per_image": round(1000 * cpu / (args.procs * args.iters * b), 3),
            "cores_busy": round(cpu / wall, 2),  # the processes' CPU over the slowest one's time
            "gpu_wait": args.gpu_wait,
        }
        rows.append(row)
    return rows


def _child(args, batches: list[int], barrier, results) -> None:
    out: dict[int, tuple[float, float] | str] = {}  # per batch size: (wall, CPU) seconds of the timed calls
    try:
        torch.set_num_threads(thread_share(args.procs))  # each its share, as Triton's instances take theirs
        blobs = load_images(args.images)
        det = _detector(args, batches)
    except Exception as e:  # the others still meet at the barriers; the parent reports the failure
        det, out = None, {b: str(e).splitlines()[0] for b in batches}
    for b in batches:
        reqs = _requests(args, blobs, b, offset=os.getpid()) if det else []
        for _ in range(args.warmup if det else 0):
            det(reqs)
        barrier.wait()
        if det is None:
            continue
        t0, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.iters):
            det(reqs)  # each call ends in a device-to-host copy of the detections: it is synchronous
        out[b] = (time.perf_counter() - t0, time.process_time() - cpu)
    results.put(out)
