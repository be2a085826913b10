"""`yolov9 bench train`: steady-state training throughput on real data through the real loader and step."""

from __future__ import annotations

import json
import threading
import time

import torch
from torch import nn

from train.data.augment import Hyp
from train.data.dataset import DetectionDataset, build_loader
from train.data.formats import load_split, resolve_data
from train.gpu_monitor import GpuMonitor
from train.loss import DetectionLoss
from train.model import DetectionModel
from train.trainer import build_optimizer, forward_backward, select_device


class _UtilSampler(threading.Thread):
    """Samples NVML utilisation every 50 ms while the timed steps run."""

    def __init__(self, monitor: GpuMonitor):
        super().__init__(daemon=True)
        self.monitor, self.samples, self.stop = monitor, [], threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            u = self.monitor.utilization()
            if u is not None:
                self.samples.append(u)
            time.sleep(0.05)


def bench_train(args) -> list[dict]:
    dev = select_device(args.device)
    ds = DetectionDataset(
        load_split(resolve_data(args.data), "train"),
        args.img,
        augment=True,
        hyp=Hyp(),
        cache=None if args.cache == "none" else args.cache,
        workers=args.workers,
        desc="bench",
    )
    results = []
    for amp in args.amp.split(","):
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "off": None}[amp]
        torch.manual_seed(0)
        model = DetectionModel(args.cfg, nc=len(ds.names)).to(dev).train()
        if dev.type == "cuda":
            model = model.to(memory_format=torch.channels_last)
            torch.cuda.reset_peak_memory_stats(dev)
        loss_fn = DetectionLoss.for_model(model)
        opt = build_optimizer(model, "SGD", 0.01, 0.937, 5e-4)
        scaler = torch.amp.GradScaler(dev.type, enabled=dtype is torch.float16)
        loader = build_loader(ds, args.batch, args.workers, True, pin=dev.type == "cuda")
        monitor = GpuMonitor(dev)
        sampler = _UtilSampler(monitor)
        total = args.warmup + args.steps
        step, wait, t0, it = 0, 0.0, None, iter(loader)  # continuous loader: no per-epoch refill
        while step < total:
            if step == args.warmup and t0 is None:
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                t0, wait = time.perf_counter(), 0.0
                sampler.start()
            tw = time.perf_counter()
            imgs, _, targets, _, _ = next(it)
            wait += time.perf_counter() - tw
            forward_backward(model, imgs, targets, loss_fn, dtype, scaler)
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            step += 1
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        el = time.perf_counter() - t0
        sampler.stop.set()
        row = {
            "amp": amp,
            "cfg": args.cfg,
            "img": args.img,
            "batch": args.batch,
            "steps": args.steps,
            "images_per_s": round(args.steps * args.batch / el, 1),
            "data_wait_share": round(wait / el, 3),
            "gpu_busy_pct": round(sum(sampler.samples) / len(sampler.samples), 1) if sampler.samples else None,
            "peak_memory_gib": round(monitor.peak_gib(), 2),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        }
        print(json.dumps(row))
        results.append(row)
        del loader, it
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return results
