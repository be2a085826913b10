"""`yolov9 bench train`: steady-state training throughput on real data through the real loader and step."""

from __future__ import annotations

import gc
import json
import threading
import time

import torch

from yolov9.core.device import synchronized_time
from yolov9.core.errors import Unavailable
from yolov9.core.model import DetectionModel
from yolov9.core.profiling import profile_calls
from yolov9.train import distributed
from yolov9.train.compiled import cache_counts, loss_compiled, resolve_mode
from yolov9.train.config import BenchTrainConfig, Hyp
from yolov9.train.data.dataset import Cache, DetectionDataset, EpochBatchSampler, run_batches, train_loader
from yolov9.train.data.formats import load_split, resolve_data
from yolov9.train.data.pinned import close_batches
from yolov9.train.ema import ModelEMA
from yolov9.train.engine import TrainStep, step_module
from yolov9.train.gpu_monitor import GpuMonitor
from yolov9.train.loss import DetectionLoss
from yolov9.train.step import AMP_DTYPES, StepOptions, build_optimizer, make_scaler


class _UtilSampler(threading.Thread):
    """Samples NVML utilisation and device memory in use (what nvidia-smi shows) every 50 ms while steps run."""

    def __init__(self, monitor: GpuMonitor):
        super().__init__(daemon=True)
        self.monitor, self.samples, self.used_peak, self.stop = monitor, [], 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            u = self.monitor.utilization()
            if u is not None:
                self.samples.append(u)
            self.used_peak = max(self.used_peak, self.monitor.used_gib() or 0.0)
            time.sleep(0.05)


def training_gflop_per_image(model: torch.nn.Module, img: int, dev: torch.device) -> float:
    """Forward plus backward FLOPs of one training image, counted by torch's FLOP counter on a batch of two
    (BatchNorm needs more than one value per channel); parameters' gradients are left as they were (set aside,
    so that the count's backward does not accumulate into gradients a graphed step keeps)."""
    from torch.utils.flop_counter import FlopCounterMode

    grads = [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    counter = FlopCounterMode(display=False)
    with counter, torch.autocast(dev.type, enabled=False):
        out = model(torch.zeros(2, 3, img, img, device=dev))
        sum(t.float().sum() for t in _leaves(out)).backward()
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    return counter.get_total_flops() / 2 / 1e9


def _leaves(out):
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in _leaves(o)]


def bench_train(args: BenchTrainConfig) -> list[dict]:
    """Under torchrun every rank times its own steps with --batch images each (per GPU); rank 0 reports the sum."""
    ctx = distributed.init(args.device)
    cache = None if args.cache == "none" else Cache(args.cache, args.workers, ctx)
    ds = DetectionDataset(load_split(resolve_data(args.data), "train"), args.img, Hyp(), cache, desc="bench")
    results, failure = [], None
    for amp in args.amp.split(","):
        try:
            row = _bench_mode(args, ds, ctx, amp)
        except torch.OutOfMemoryError:
            if ctx.active:  # the other ranks would wait for this one at their next collective
                raise
            failure = _out_of_memory(args, ctx.device, amp)
            results.append({**_mode_keys(args, amp), "error": failure})
            break  # the modes left would run out of memory as well
        if ctx.main:
            print(json.dumps(row))
        results.append(row)
    distributed.close()
    if args.out and ctx.main:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    if failure:
        raise Unavailable(failure)
    return results


def _mode_keys(args: BenchTrainConfig, amp: str) -> dict:
    """The keys that name a row, first in a measured one and in one that failed."""
    return {"amp": amp, "cfg": args.cfg, "img": args.img, "batch": args.batch}


def _out_of_memory(args: BenchTrainConfig, dev: torch.device, amp: str) -> str:
    where = str(dev)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        where = f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
    return f"out of memory training {args.cfg} at --batch {args.batch} ({amp}) on {where}; try a smaller --batch"


def _build(args, nc: int, ctx: distributed.DistContext, dtype: torch.dtype | None, channels_last: bool):
    """The model and the step (DDP-wrapped under torchrun, captured where graphs are on), as trained."""
    dev = ctx.device
    torch.manual_seed(0)
    model = DetectionModel(args.cfg, nc=nc).to(dev).train()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    loss_fn = DetectionLoss.for_model(model)
    opt = build_optimizer(model, "SGD", 0.01, 0.937, 5e-4)
    mode = resolve_mode(args.compile, dev, ctx.active)
    opts = StepOptions(dtype, channels_last, ctx.world, 10.0, args.cuda_graph, mode, args.compile_loss)
    net = step_module(model, opts, ctx)
    step = TrainStep(model, net, loss_fn, opt, make_scaler(dev, dtype), ModelEMA(model) if ctx.main else None, opts)
    return model, step


def _bench_mode(args, ds: DetectionDataset, ctx: distributed.DistContext, amp: str) -> dict:
    dev = ctx.device
    dtype = AMP_DTYPES[amp]
    channels_last = args.channels_last and dev.type == "cuda"
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    if dev.type == "cuda":  # the last mode's cached blocks go back to the driver, so each mode's peaks are its own
        gc.collect()
        torch.cuda.empty_cache()
    t_build = time.perf_counter()
    model, train_step = _build(args, len(ds.names), ctx, dtype, channels_last)
    sampler = EpochBatchSampler(len(ds), args.batch, shard=(ctx.rank, ctx.world))
    it = run_batches(train_loader(ds, sampler, args.workers), pin=dev)  # one iterator: no refills, pinned as trained
    monitor = GpuMonitor(dev)
    sampler = _UtilSampler(monitor)
    wait = 0.0

    def step() -> None:  # what one trainer step does when the nominal batch equals the batch
        nonlocal wait
        tw = time.perf_counter()
        batch = next(it)
        wait += time.perf_counter() - tw
        train_step.micro(batch.images, batch.rows)
        train_step.step()

    try:
        t_warm = time.perf_counter()
        step()  # the first step captures and compiles: timed on its own, from the model's build
        first_step_s = synchronized_time(dev) - t_build
        for _ in range(args.warmup - 1):
            step()
        warmup_s = synchronized_time(dev) - t_warm
        t0, wait = time.perf_counter(), 0.0
        sampler.start()
        for _ in range(args.steps):
            step()
        el = float(distributed.mean(ctx, torch.tensor(synchronized_time(dev) - t0, device=dev)))
        sampler.stop.set()
        ips = args.steps * args.batch * ctx.world / el
        gflop = training_gflop_per_image(model, args.img, dev)
        tflops = ips * gflop / 1e3 / ctx.world  # per GPU
        row = {
            **_mode_keys(args, amp),
            "channels_last": channels_last,
            "cudnn_benchmark": args.cudnn_benchmark,
            "steps": args.steps,
            "gpus": ctx.world,
            "cuda_graph": train_step.graphs,
            "graph_captures": train_step.captures,
            "compile": train_step.opts.compile,
            "compile_loss": loss_compiled(train_step.opts.compile, args.compile_loss),
            "images_per_s": round(ips, 1),
            "data_wait_share": round(wait / el, 3),
            "gpu_busy_pct": round(sum(sampler.samples) / len(sampler.samples), 1) if sampler.samples else None,
            "first_step_s": round(first_step_s, 1),
            "warmup_s": round(warmup_s, 1),
            "train_gflop_per_image": round(gflop, 3),
            "achieved_tflops_per_gpu": round(tflops, 1),
            "mfu": round(tflops / args.peak_tflops, 3) if dev.type == "cuda" else None,
            "peak_memory_gib": round(monitor.peak_gib(), 2),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 2) if dev.type == "cuda" else 0.0,
            "peak_nvidia_smi_gib": round(sampler.used_peak, 2) if sampler.used_peak else None,
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        }
        if train_step.opts.compile != "off":
            row.update(cache_counts())
        if args.profile:
            row.update(profile_calls(step, 3, dev, args.profile))
        return row
    finally:  # on a failure too
        sampler.stop.set()
        close_batches(it)  # the next mode starts its own workers
