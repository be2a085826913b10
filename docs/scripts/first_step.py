"""Where a process's first training step goes (issue "Trainer throughput": time to the first step). One fresh process
per call: imports, the model on the GPU, then eager steps (forward, loss, backward, fused optimizer step) on a
synthetic batch, each synchronised and timed, with cuDNN's benchmark mode on or off and its algorithm limit, after
an optional warm-up of a copy first (train/prewarm.py). Prints one JSON line:

    python docs/scripts/first_step.py --cfg yolov9-s --batch 128 --benchmark on --limit 10 [--prewarm] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import time

import psutil

T0 = psutil.Process().create_time()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cfg", default="yolov9-s")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--img", type=int, default=640)
    ap.add_argument("--benchmark", choices=("on", "off"), default="on")
    ap.add_argument("--limit", type=int, default=None, help="torch.backends.cudnn.benchmark_limit (torch's: 10)")
    ap.add_argument("--prewarm", action="store_true", help="warm a copy up first (train/prewarm.py)")
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()

    import torch

    from yolov9.core.model import DetectionModel, load_cfg
    from yolov9.train.loss import DetectionLoss
    from yolov9.train.prewarm import prewarm, synthetic_batch
    from yolov9.train.step import StepOptions, build_optimizer, forward_backward, make_scaler, optimizer_step

    row: dict = {"cfg": a.cfg, "batch": a.batch, "benchmark": a.benchmark, "limit": a.limit, "prewarm": a.prewarm}
    row["imports_s"] = time.time() - T0
    dev = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = a.benchmark == "on"
    if a.limit is not None:
        torch.backends.cudnn.benchmark_limit = a.limit
    t = time.perf_counter()
    model = DetectionModel(load_cfg(a.cfg), nc=80).to(dev).to(memory_format=torch.channels_last)
    torch.cuda.synchronize()
    row["model_s"] = time.perf_counter() - t
    opts = StepOptions(torch.float16)
    if a.prewarm:
        row["prewarm_parts_s"], row["prewarm_error"] = prewarm(model, a.batch, a.img, opts)
        row["prewarm_s"] = sum(row["prewarm_parts_s"].values())
    loss_fn = DetectionLoss.for_model(model)
    scaler = make_scaler(dev, torch.float16)
    opt = build_optimizer(model, "SGD", 0.01, 0.937, 5e-4)
    imgs, targets = synthetic_batch(a.batch, a.img, 80, seed=1)
    imgs = imgs.pin_memory()
    steps = []
    for _ in range(a.steps):
        t = time.perf_counter()
        forward_backward(model, imgs, targets, loss_fn, scaler, opts)
        optimizer_step(model, opt, scaler, None, 10.0)
        torch.cuda.synchronize()
        steps.append(round(time.perf_counter() - t, 4))
    row.update(steps_s=steps, steady_s=sorted(steps[3:])[len(steps[3:]) // 2] if len(steps) > 3 else None)
    row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    row["process_s"] = time.time() - T0
    print(json.dumps(row))


if __name__ == "__main__":
    main()
