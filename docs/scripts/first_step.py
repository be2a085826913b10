"""Where a process's first training step goes (issue "Trainer throughput": time to the first step). One fresh process
per call: imports, the model on the GPU, then eager steps (forward, loss, backward, fused optimizer step) on a
synthetic batch, each synchronised and timed, with cuDNN's benchmark mode on or off and its algorithm limit, after
an optional warm-up of a copy first (train/prewarm.py). Prints one JSON line:

    python docs/scripts/first_step.py --cfg yolov9-s --batch 128 --benchmark on --limit 10 [--prewarm] [--steps 8]

--split times cuDNN's choices in two threads at once before the steps: this thread runs the forward alone (no
gradient; its choices stay in this thread's cache), another thread a copy's forward and backward (the backward's
choices land in autograd's device thread, which every thread's backward shares). Is the timing bound by the GPU
(no faster in two threads) or by the host (plan building), and do choices timed side by side train as fast?
"""

from __future__ import annotations

import argparse
import copy
import json
import threading
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
    ap.add_argument("--split", action="store_true", help="time the forward and the backward in two threads at once")
    a = ap.parse_args()

    import torch

    from yolov9.core.model import DetectionModel, load_cfg
    from yolov9.train.loss import DetectionLoss
    from yolov9.train.prewarm import prewarm, synthetic_batch
    from yolov9.train.step import StepOptions, build_optimizer, forward_backward, make_scaler, optimizer_step

    row: dict = {"cfg": a.cfg, "batch": a.batch, "benchmark": a.benchmark, "limit": a.limit, "prewarm": a.prewarm,
                 "split": a.split}  # fmt: skip
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
    if a.split:
        row["split_s"] = split_timing(model, a.batch, a.img, opts)
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


def split_timing(model, batch: int, img: int, opts) -> dict:
    """This thread's forward (no gradient) beside another thread's forward and backward of a copy; seconds each."""
    import torch

    from yolov9.core.preprocess import to_input
    from yolov9.train.loss import DetectionLoss
    from yolov9.train.prewarm import synthetic_batch
    from yolov9.train.step import forward_backward, make_scaler

    dev = next(model.parameters()).device
    imgs, targets = synthetic_batch(batch, img, 80, seed=2, device=dev)
    twin = copy.deepcopy(model)
    took: dict = {}

    def backward_thread() -> None:
        t = time.perf_counter()
        forward_backward(twin, imgs, targets, DetectionLoss.for_model(twin), make_scaler(dev, torch.float16), opts)
        torch.cuda.synchronize()
        took["helper_fwd_bwd"] = round(time.perf_counter() - t, 3)

    t = time.perf_counter()
    helper = threading.Thread(target=backward_thread)
    helper.start()
    with torch.no_grad(), torch.autocast("cuda", torch.float16):
        model(to_input(imgs.contiguous(memory_format=torch.channels_last)))
    torch.cuda.synchronize()
    took["forward"] = round(time.perf_counter() - t, 3)
    helper.join()
    took["both"] = round(time.perf_counter() - t, 3)
    torch.cuda.empty_cache()
    return took


if __name__ == "__main__":
    main()
