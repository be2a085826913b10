"""`yolov9 bench detector`: the whole serving computation of one Triton batch (decode, letterbox, engine, NMS)
on real encoded images, per batch size, with the time split by stage. No server: this is the ceiling the
python-backend model can reach per instance."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from serve.detector import Detector, Request

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def bench_detector(args) -> list[dict]:
    files = sorted(p for p in Path(args.images).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise SystemExit(f"{args.images}: no images")
    blobs = [p.read_bytes() for p in files]
    batches = [int(b) for b in args.batches.split(",")]
    det = Detector(
        args.engine, device=args.device, img_size=args.img, cuda_graphs=not args.no_cuda_graphs, max_batch=max(batches)
    )
    det.warmup()
    rows = []
    for b in batches:
        reqs = [Request(blobs[i % len(blobs)], conf=args.conf) for i in range(b)]
        for _ in range(args.warmup):
            det(reqs)
        if det.device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.iters):
            det(reqs)
        if det.device.type == "cuda":
            torch.cuda.synchronize()
        el = (time.perf_counter() - t) / args.iters
        stages: dict[str, float] = {}
        for _ in range(max(args.iters // 4, 1)):  # a separate, synchronised pass for the split
            det(reqs, timings=stages)
        total = sum(stages.values())
        row = {
            "engine": args.engine,
            "kind": det.engine.kind + ("+graphs" if det.buckets else ""),
            "batch": b,
            "images_per_s": round(b / el, 1),
            "ms_per_batch": round(el * 1000, 2),
            "stage_share": {k: round(v / total, 3) for k, v in stages.items()},
            "device": torch.cuda.get_device_name() if det.device.type == "cuda" else "cpu",
        }
        print(json.dumps(row))
        rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return rows
