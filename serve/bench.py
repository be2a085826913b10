"""`yolov9 bench detector`: the whole serving computation of one Triton batch (decode, letterbox, engine, NMS)
on real encoded images, per batch size, with the time split by stage. No server: this is the ceiling the
python-backend model can reach per instance."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from export.bench import seconds_per_call
from serve.detector import Detector, Request
from serve.loadtest import load_images


def bench_detector(args) -> list[dict]:
    blobs = load_images(args.images)
    batches = [int(b) for b in args.batches.split(",")]
    det = Detector(
        args.engine, device=args.device, img_size=args.img, cuda_graphs=not args.no_cuda_graphs, max_batch=max(batches)
    )
    det.warmup()
    rows = []
    for b in batches:
        reqs = [Request(blobs[i % len(blobs)], conf=args.conf) for i in range(b)]
        el = seconds_per_call(det, reqs, args.warmup, args.iters, det.device)
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
