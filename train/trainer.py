"""The trainer: AMP training loop with nominal-batch accumulation, warm-up, EMA, LR schedule, checkpoints
and exact resume. The step keeps the GPU fed: uint8 batches cross the bus and are normalised on the device,
targets arrive padded, and the only host synchronisation is one finiteness check per optimizer step."""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn
from tqdm import tqdm

from train.checkpoint import read_checkpoint, save_checkpoint
from train.data.augment import Hyp
from train.data.dataset import DetectionDataset, build_loader
from train.data.formats import load_split, resolve_data
from train.ema import ModelEMA
from train.gpu_monitor import GpuMonitor
from train.loss import DetectionLoss
from train.model import DetectionModel, load_cfg
from train.plots import plot_results
from train.preprocess import to_input
from train.validate import evaluate, format_table


@dataclass
class TrainConfig:
    """Every option of `yolov9 train`; the command line overrides these defaults."""

    data: str = "coco128"
    cfg: str = "yolov9-s"
    weights: str | None = None
    img: int = 640
    epochs: int = 100
    batch: int = 16
    nbs: int = 64
    accumulate: int | None = None
    amp: str = "bf16"
    optimizer: str = "SGD"
    cos_lr: bool = False
    clip: float = 10.0
    close_mosaic: int = 15
    cache: str | None = None
    workers: int = 8
    device: str = "auto"
    seed: int = 0
    project: str = "runs/train"
    name: str = "exp"
    exist_ok: bool = False
    val: bool = True
    val_interval: int = 1
    stop_after: int | None = None
    resume: str | None = None
    channels_last: bool = True
    cudnn_benchmark: bool = True
    hyp: dict = field(default_factory=dict)


def select_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.isdigit():
        if not torch.cuda.is_available():
            raise RuntimeError(f"--device {spec}: no CUDA GPU on this machine (use --device cpu)")
        return torch.device(f"cuda:{spec}")
    return torch.device(spec)


def build_optimizer(model: nn.Module, name: str, lr: float, momentum: float, decay: float):
    """Three groups as officially: biases (no decay), weights (decay), norm weights (no decay)."""
    biases, weights, norms = [], [], []
    for m in model.modules():
        if isinstance(getattr(m, "bias", None), nn.Parameter):
            biases.append(m.bias)
        if isinstance(m, nn.BatchNorm2d):
            norms.append(m.weight)
        elif isinstance(getattr(m, "weight", None), nn.Parameter) and m.weight.requires_grad:
            weights.append(m.weight)
    if name == "SGD":
        opt = torch.optim.SGD(biases, lr=lr, momentum=momentum, nesterov=True)
    elif name == "AdamW":
        opt = torch.optim.AdamW(biases, lr=lr, betas=(momentum, 0.999), weight_decay=0.0)
    else:
        raise ValueError(f"--optimizer {name}: choose SGD or AdamW")
    opt.add_param_group({"params": weights, "weight_decay": decay})
    opt.add_param_group({"params": norms, "weight_decay": 0.0})
    return opt


def forward_backward(
    model: nn.Module,
    imgs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: DetectionLoss,
    amp_dtype: torch.dtype | None,
    scaler: torch.amp.GradScaler,
    channels_last: bool = True,
):
    """One micro-batch: uint8 images to the device, normalised there, autocast forward, fp32 loss, backward.
    Shared by the trainer, `bench train` and --batch -1, so what is timed is what trains."""
    dev = next(model.parameters()).device
    x = imgs.to(dev, non_blocking=True)
    if channels_last and dev.type == "cuda":
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.autocast(dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
        preds = model(to_input(x))
    loss, items = loss_fn(preds, targets.to(dev, non_blocking=True), padded=True)
    scaler.scale(loss).backward()
    return loss, items


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    ema: ModelEMA | None,
    clip: float,
    loss: torch.Tensor,
) -> bool:
    """Unscale, clip, step, EMA; False (nothing applied) for a non-finite loss. The finiteness check is the one
    host synchronisation of a training step. Shared by the trainer and `bench train`."""
    ok = bool(torch.isfinite(loss))
    if ok:
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
        scaler.step(optimizer)
        scaler.update()
        if ema is not None:
            ema.update(model)
    optimizer.zero_grad(set_to_none=True)
    return ok


def lr_lambda(epochs: int, lrf: float, cosine: bool):
    if cosine:
        return lambda x: ((1 - math.cos(x * math.pi / epochs)) / 2) * (lrf - 1) + 1
    return lambda x: (1 - x / epochs) * (1.0 - lrf) + lrf


def rng_state() -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": json.dumps(np.random.get_state()[1].tolist()),
        "python": json.dumps(random.getstate()[1]),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def new_run_dir(project: str, name: str, exist_ok: bool) -> Path:
    base = Path(project) / name
    path, k = base, 2
    while path.exists() and not exist_ok:
        path, k = Path(f"{base}{k}"), k + 1
    (path / "weights").mkdir(parents=True, exist_ok=True)
    latest = Path(project) / "latest"
    if latest.is_symlink() or not latest.exists():
        latest.unlink(missing_ok=True)
        latest.symlink_to(path.name)
    return path


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.resume_state = None
        if cfg.resume:
            ck_path = Path(cfg.resume)
            if ck_path.is_dir():
                ck_path = ck_path / "weights" / "last.pt"
            self.resume_state = read_checkpoint(ck_path)
            if "train" not in self.resume_state:
                raise ValueError(
                    f"{ck_path}: holds no training state to resume from (a final or converted "
                    f"checkpoint); start a new run with --weights instead"
                )
            saved = dict(self.resume_state["train"]["config"])
            saved.update(
                resume=str(ck_path),
                stop_after=cfg.stop_after,
                exist_ok=True,
                name=ck_path.parents[1].name,
                project=str(ck_path.parents[2]),
                device=cfg.device,
                workers=cfg.workers,
            )
            cfg = TrainConfig(**saved)
        self.cfg = cfg
        self.device = select_device(cfg.device)
        self.hyp = Hyp(**cfg.hyp)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        self.dir = new_run_dir(cfg.project, cfg.name, cfg.exist_ok)
        self.amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "off": None}[cfg.amp]
        if self.device.type == "cpu" and cfg.amp == "fp16":
            print("note: --amp fp16 is GPU-only; using bf16 autocast on the CPU")
            self.amp_dtype = torch.bfloat16

        spec = resolve_data(cfg.data)
        self.train_ds = DetectionDataset(
            load_split(spec, "train"),
            cfg.img,
            augment=True,
            hyp=self.hyp,
            cache=cfg.cache,
            seed=cfg.seed,
            workers=cfg.workers,
            desc="train",
        )
        self.val_ds = (
            DetectionDataset(
                load_split(spec, "val"), cfg.img, augment=False, cache=cfg.cache, workers=cfg.workers, desc="val"
            )
            if cfg.val
            else None
        )
        print(self.train_ds.problems.summary())
        (self.dir / "data_problems.txt").write_text(self.train_ds.problems.summary() + "\n")
        self.names = self.train_ds.names
        self.model = self._build_model().to(self.device)
        if cfg.channels_last and self.device.type == "cuda":
            self.model = self.model.to(memory_format=torch.channels_last)
        if self.device.type == "cuda":  # input size is fixed: let cuDNN time its algorithms once per shape
            torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
        (self.dir / "args.yaml").write_text(yaml.safe_dump(asdict(cfg), sort_keys=False))

    def _build_model(self) -> DetectionModel:
        nc = len(self.names)
        if self.resume_state is not None:
            model = DetectionModel(self.resume_state["cfg"], names=self.names)
            model.load_state_dict(self.resume_state["train"]["model"])
            return model
        if self.cfg.weights:
            ck = read_checkpoint(self.cfg.weights)
            model = DetectionModel(ck["cfg"], nc=nc, names=self.names)
            own = model.state_dict()
            fit = {k: v for k, v in ck["model"].items() if k in own and own[k].shape == v.shape}
            model.load_state_dict(fit, strict=False)
            print(
                f"weights: {len(fit)}/{len(own)} tensors from {self.cfg.weights}"
                + (f" (class outputs re-initialised for {nc} classes)" if len(fit) < len(own) else "")
            )
            return model
        return DetectionModel(load_cfg(self.cfg.cfg), nc=nc, names=self.names)

    def auto_batch(self) -> int:
        """Largest batch that fits in about 85% of GPU memory, from the memory of two trial batches."""
        if self.device.type != "cuda":
            print("--batch -1: no GPU, using 16")
            return 16
        loss_fn = DetectionLoss.for_model(self.model)
        no_scaling = torch.amp.GradScaler(self.device.type, enabled=False)
        used = []
        sizes = (4, 8)
        for b in sizes:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            imgs = torch.randint(0, 256, (b, 3, self.cfg.img, self.cfg.img), dtype=torch.uint8)
            forward_backward(
                self.model, imgs, torch.zeros(b, 1, 5), loss_fn, self.amp_dtype, no_scaling, self.cfg.channels_last
            )
            self.model.zero_grad(set_to_none=True)
            used.append(torch.cuda.max_memory_allocated(self.device))
        per = (used[1] - used[0]) / (sizes[1] - sizes[0])
        total = torch.cuda.get_device_properties(self.device).total_memory
        batch = int((0.85 * total - (used[0] - per * sizes[0])) // max(per, 1))
        batch = max(1, min(batch, 1024) // 8 * 8 or batch)
        print(f"--batch -1: using batch {batch} ({per / 2**20:.0f} MiB per image)")
        return batch

    def fit(self) -> dict:
        cfg, hyp, dev = self.cfg, self.hyp, self.device
        model = self.model
        batch = self.auto_batch() if cfg.batch == -1 else cfg.batch
        loss_fn = DetectionLoss.for_model(model)
        accumulate = cfg.accumulate or max(round(cfg.nbs / batch), 1)
        decay = hyp.weight_decay * batch * accumulate / cfg.nbs
        optimizer = build_optimizer(model, cfg.optimizer, hyp.lr0, hyp.momentum, decay)
        lf = lr_lambda(cfg.epochs, hyp.lrf, cfg.cos_lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
        scaler = torch.amp.GradScaler(dev.type, enabled=self.amp_dtype is torch.float16)
        ema = ModelEMA(model)
        start_epoch, best = 0, -1.0
        if self.resume_state is not None:
            st = self.resume_state["train"]
            optimizer.load_state_dict(st["optimizer"])
            scheduler.load_state_dict(st["scheduler"])
            scaler.load_state_dict(st["scaler"])
            ema.load_state_dict({"model": self.resume_state["model"], "updates": st["ema_updates"]})
            start_epoch, best, batch = st["epoch"] + 1, st["best_fitness"], st["batch"]
            accumulate = cfg.accumulate or max(round(cfg.nbs / batch), 1)
            set_rng_state(st["rng"])
            print(f"resuming from epoch {start_epoch} of {cfg.epochs}")

        pin = dev.type == "cuda"
        self.train_ds.mosaic_until = cfg.epochs - cfg.close_mosaic
        loader = build_loader(self.train_ds, batch, cfg.workers, True, cfg.seed, pin=pin, start_epoch=start_epoch)
        val_loader = build_loader(self.val_ds, batch * 2, cfg.workers, False, pin=pin) if self.val_ds else None
        nb = len(loader)
        nw = max(round(hyp.warmup_epochs * nb), 100) if hyp.warmup_epochs > 0 else -1  # official minimum: 100
        monitor = GpuMonitor(dev)
        log_path = self.dir / "results.jsonl"
        writer = _tensorboard(self.dir)
        last_opt_step = -1
        skipped = torch.zeros((), device=dev)
        end_epoch = cfg.epochs if cfg.stop_after is None else min(cfg.epochs, start_epoch + cfg.stop_after)
        epoch = start_epoch
        summary = {}
        it = iter(loader)  # one iterator for the whole run: workers prefetch across epoch boundaries
        while epoch < end_epoch:
            model.train()
            mosaic_on = epoch < self.train_ds.mosaic_until
            mloss = torch.zeros(3, device=dev)
            optimizer.zero_grad(set_to_none=True)
            t_epoch, t_wait, seen = time.perf_counter(), 0.0, 0
            pbar = tqdm(total=nb, desc=f"epoch {epoch + 1}/{cfg.epochs}", dynamic_ncols=True)
            try:
                for i in range(nb):
                    t0 = time.perf_counter()
                    imgs, _, targets, _, _ = next(it)
                    t_wait += time.perf_counter() - t0
                    ni = i + nb * epoch
                    if ni <= nw:  # warm-up: accumulate, LR and momentum ramp in
                        xi = [0, nw]
                        accumulate = max(1, round(float(np.interp(ni, xi, [1, cfg.accumulate or cfg.nbs / batch]))))
                        for j, g in enumerate(optimizer.param_groups):
                            # plain floats: numpy scalars would make the checkpoint unreadable with weights_only
                            g["lr"] = float(
                                np.interp(ni, xi, [hyp.warmup_bias_lr if j == 0 else 0.0, g["initial_lr"] * lf(epoch)])
                            )
                            if "momentum" in g:
                                g["momentum"] = float(np.interp(ni, xi, [hyp.warmup_momentum, hyp.momentum]))
                    loss, items = forward_backward(
                        model, imgs, targets, loss_fn, self.amp_dtype, scaler, cfg.channels_last
                    )
                    mloss = (mloss * i + items) / (i + 1)
                    seen += imgs.shape[0]
                    if ni - last_opt_step >= accumulate:
                        if not optimizer_step(model, optimizer, scaler, ema, cfg.clip, loss):
                            skipped += 1
                            tqdm.write(f"warning: non-finite loss at epoch {epoch + 1} step {i}; step skipped")
                        last_opt_step = ni
                    if i % 10 == 0 or i == nb - 1:
                        el = time.perf_counter() - t_epoch
                        b, c, d = mloss.tolist()
                        pbar.set_postfix_str(
                            f"box {b:.3f} cls {c:.3f} dfl {d:.3f} | {seen / el:.0f} img/s | "
                            f"data {100 * t_wait / el:.0f}% | {monitor.read()}"
                        )
                    pbar.update(1)
            except torch.OutOfMemoryError:
                pbar.close()
                del it
                optimizer.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                if batch == 1:
                    raise
                batch //= 2
                tqdm.write(f"warning: CUDA out of memory; batch halved to {batch}, restarting epoch {epoch + 1}")
                loader = build_loader(self.train_ds, batch, cfg.workers, True, cfg.seed, pin=pin, start_epoch=epoch)
                nb = len(loader)
                it = iter(loader)
                continue
            pbar.close()
            scheduler.step()
            el = time.perf_counter() - t_epoch
            row = {
                "epoch": epoch,
                "box": mloss[0].item(),
                "cls": mloss[1].item(),
                "dfl": mloss[2].item(),
                "lr": optimizer.param_groups[0]["lr"],
                "images_per_s": seen / el,
                "data_wait": t_wait / el,
                "mosaic": mosaic_on and hyp.mosaic > 0,
                "batch": batch,
            }
            final = epoch == cfg.epochs - 1
            if val_loader is not None and ((epoch + 1) % cfg.val_interval == 0 or final or epoch == end_epoch - 1):
                res = evaluate(ema.ema, val_loader, dev)
                row.update(map=res["map"], map50=res["map50"])
                fitness = 0.1 * res["map50"] + 0.9 * res["map"]
                if final:
                    (self.dir / "val_per_class.txt").write_text(format_table(res) + "\n")
                    summary["per_class"] = res["per_class"]
            else:
                fitness = -1.0
            ckpt_train = {
                "config": asdict(cfg),
                "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(),
                "ema_updates": ema.updates,
                "epoch": epoch,
                "best_fitness": max(best, fitness),
                "batch": batch,
                "rng": rng_state(),
            }
            meta = {"epoch": epoch, "map": row.get("map"), "map50": row.get("map50"), "data": cfg.data}
            save_checkpoint(self.dir / "weights" / "last.pt", ema.ema, meta, train=ckpt_train)
            if fitness > best:
                best = fitness
                save_checkpoint(self.dir / "weights" / "best.pt", ema.ema, meta)
            with open(log_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            _write_csv(self.dir / "results.csv", row)
            if writer:
                for k, v in row.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        writer.add_scalar(k, v, epoch)
            tqdm.write("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
            epoch += 1
        if not (self.dir / "weights" / "best.pt").exists() and (self.dir / "weights" / "last.pt").exists():
            save_checkpoint(self.dir / "weights" / "best.pt", ema.ema, {"epoch": epoch - 1})
        plot_results(log_path, self.dir / "results.png")
        if writer:
            writer.close()
        rows = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
        summary.update(
            run_dir=str(self.dir),
            epochs=[r["epoch"] for r in rows],
            last=rows[-1] if rows else {},
            skipped_steps=int(skipped.item()),
            peak_memory_gib=monitor.peak_gib(),
        )
        return summary


def _write_csv(path: Path, row: dict) -> None:
    new = not path.exists()
    with open(path, "a") as f:
        if new:
            f.write(",".join(row) + "\n")
        f.write(",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in row.values()) + "\n")


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is optional
        return None
    return SummaryWriter(str(run_dir))
