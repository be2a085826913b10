"""The trainer: AMP training with nominal-batch accumulation, warm-up, EMA, LR schedule, checkpoints and exact
resume. `Trainer.fit` is the run (set-up, then per epoch: `train_one_epoch`, validation, checkpoint, log row); the
step keeps the GPU fed: uint8 batches cross the bus and are normalised on the device, targets arrive padded, and
no step waits for the host (non-finite steps are skipped on the device, train/step.py)."""

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
from tqdm import tqdm

from core.checkpoint import read_checkpoint, save_checkpoint
from core.model import DetectionModel, load_cfg
from train import distributed
from train.data.augment import Hyp
from train.data.dataset import DetectionDataset, build_loader
from train.data.formats import load_split, resolve_data
from train.ema import ModelEMA
from train.gpu_monitor import GpuMonitor
from train.graphed_step import StepOptions, TrainStep
from train.loss import DetectionLoss
from train.run_log import RunLog
from train.step import amp_dtype, build_optimizer, forward_backward, load_optimizer_state, make_scaler
from train.validate import evaluate, format_table


@dataclass
class TrainConfig:
    """Every option of `yolov9 train`; the command line overrides these defaults."""

    data: str | None = None
    cfg: str = "yolov9-s"
    weights: str | None = None
    img: int = 640
    epochs: int = 100
    batch: int = 16
    nbs: int = 64
    accumulate: int | None = None
    amp: str = "auto"
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
    sync_bn: bool = False
    cuda_graph: bool = True
    hyp: dict = field(default_factory=dict)


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
    """project/name (a number appended if taken), with `project/latest` pointing at it. Made only once training
    starts, so a run that fails in its set-up leaves no folder and does not move `latest`."""
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


def _param_sum(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.double().sum() for p in model.parameters()))


def warmup(optimizer: torch.optim.Optimizer, ni: int, nw: int, lr_scale: float, hyp: Hyp, accumulate: float) -> int:
    """The official warm-up at step ni of nw: accumulation ramps from 1, the bias LR down from warmup_bias_lr and
    the other LRs up from 0 to their scheduled values, momentum up from warmup_momentum. Returns the accumulation."""
    xi = [0, nw]
    for j, g in enumerate(optimizer.param_groups):
        # plain floats: numpy scalars would make the checkpoint unreadable with weights_only
        g["lr"] = float(np.interp(ni, xi, [hyp.warmup_bias_lr if j == 0 else 0.0, g["initial_lr"] * lr_scale]))
        if "momentum" in g:
            g["momentum"] = float(np.interp(ni, xi, [hyp.warmup_momentum, hyp.momentum]))
    return max(1, round(float(np.interp(ni, xi, [1, accumulate]))))


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.resume_state = None
        if cfg.resume:
            cfg = self._resume_config(cfg)
        self.cfg = cfg
        self.dist = distributed.init(cfg.device)
        self.device, self.main = self.dist.device, self.dist.main
        if cfg.batch != -1 and cfg.batch % self.dist.world:
            raise ValueError(f"--batch {cfg.batch} is the global batch: it must divide by the {self.dist.world} ranks")
        self.hyp = Hyp(**cfg.hyp)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        self.amp_dtype = amp_dtype(cfg.amp, self.device)
        spec = resolve_data(cfg.data)
        # what `val` without --data reads back from the checkpoint: a name, or an absolute path
        self.data_name = (
            str(Path(cfg.data).resolve()) if cfg.data and Path(cfg.data).exists() else str(cfg.data or spec["root"])
        )
        kw = dict(cache=cfg.cache, workers=cfg.workers)
        self.train_ds = DetectionDataset(
            load_split(spec, "train"), cfg.img, augment=True, hyp=self.hyp, seed=cfg.seed, desc="train",
            dist_ctx=self.dist, **kw,
        )  # fmt: skip
        # validation runs on rank 0 alone, so only rank 0 loads (and caches) the validation split
        self.val_ds = None
        if cfg.val and self.main:
            self.val_ds = DetectionDataset(load_split(spec, "val"), cfg.img, desc="val", **kw)
        if self.main:
            for ds in filter(None, (self.train_ds, self.val_ds)):
                print(ds.describe())
            print(self.train_ds.problems.summary())
        self.names = self.train_ds.names
        self.model = self._build_model().to(self.device)
        if cfg.channels_last and self.device.type == "cuda":
            self.model = self.model.to(memory_format=torch.channels_last)
        if cfg.sync_bn and self.dist.active:
            if self.device.type != "cuda":
                raise ValueError("--sync-bn needs CUDA GPUs (SyncBatchNorm has no CPU kernels)")
            self.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        self.net = self.model  # what the step runs: the model, or its DDP wrapper (in _setup)
        if self.device.type == "cuda":  # input size is fixed: let cuDNN time its algorithms once per shape
            torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
        self.dir: Path | None = None

    def _resume_config(self, cfg: TrainConfig) -> TrainConfig:
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
        return TrainConfig(**saved)

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
        no_scaling = make_scaler(self.device, None)
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

    # --- set-up -----------------------------------------------------------------------------------------------
    def _setup(self) -> int:
        """Optimizer, schedule, scaler, EMA and loss (restored when resuming); returns the first epoch."""
        cfg, hyp = self.cfg, self.hyp
        self.batch = self.auto_batch() * self.dist.world if cfg.batch == -1 else cfg.batch  # global
        if self.dist.active:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.net = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.loss_fn = DetectionLoss.for_model(self.model)
        decay = hyp.weight_decay * self.batch * self._accumulate() / cfg.nbs
        self.optimizer = build_optimizer(self.model, cfg.optimizer, hyp.lr0, hyp.momentum, decay)
        self.lf = lr_lambda(cfg.epochs, hyp.lrf, cfg.cos_lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda=self.lf)
        self.scaler = make_scaler(self.device, self.amp_dtype)
        self.ema = ModelEMA(self.model) if self.main else None  # rank 0 alone validates and saves it
        opts = StepOptions(self.amp_dtype, cfg.channels_last, self.dist.world, cfg.clip, cfg.cuda_graph)
        self.step = TrainStep(self.model, self.net, self.loss_fn, self.optimizer, self.scaler, self.ema, opts)
        if cfg.cuda_graph and self.dist.active and self.main:
            print("note: a multi-GPU run trains eagerly (CUDA graphs need one GPU; see --help)")
        self.best, self.skipped, self.last_opt_step = -1.0, torch.zeros((), device=self.device), -1
        self.train_ds.mosaic_until = cfg.epochs - cfg.close_mosaic
        if self.resume_state is None:
            return 0
        st = self.resume_state["train"]
        load_optimizer_state(self.optimizer, st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        self.scaler.load_state_dict(st["scaler"])
        if self.ema is not None:
            self.ema.load_state_dict({"model": self.resume_state["model"], "updates": st["ema_updates"]})
        self.best, self.batch = st["best_fitness"], st["batch"]
        set_rng_state(st["rng"])
        print(f"resuming from epoch {st['epoch'] + 1} of {cfg.epochs}")
        return st["epoch"] + 1

    def _accumulate(self) -> int:
        return self.cfg.accumulate or max(round(self.cfg.nbs / self.batch), 1)

    def _loader(self, start_epoch: int):
        """Each rank's share of every global batch: the same images per step as one process would take."""
        d, pin = self.dist, self.device.type == "cuda"
        per_rank = self.batch // d.world
        return build_loader(
            self.train_ds, per_rank, self.cfg.workers, True, self.cfg.seed, d.rank, d.world, pin, start_epoch
        )

    # --- the run ----------------------------------------------------------------------------------------------
    def fit(self) -> dict:
        cfg, main = self.cfg, self.main
        epoch = self._setup()
        loader = self._loader(epoch)
        val_loader = None
        if self.val_ds is not None and main:
            val_loader = build_loader(self.val_ds, self.batch * 2, cfg.workers, False, pin=self.device.type == "cuda")
        log = None
        if main:
            self.dir = new_run_dir(cfg.project, cfg.name, cfg.exist_ok)
            (self.dir / "args.yaml").write_text(yaml.safe_dump(asdict(cfg), sort_keys=False))
            (self.dir / "data_problems.txt").write_text(self.train_ds.problems.summary() + "\n")
            log = RunLog(self.dir)
        monitor, summary, self.per_class = GpuMonitor(self.device), {}, None
        end_epoch = cfg.epochs if cfg.stop_after is None else min(cfg.epochs, epoch + cfg.stop_after)
        batches = iter(loader)  # one iterator for the whole run: workers prefetch across epoch boundaries
        while epoch < end_epoch:
            try:
                row = self.train_one_epoch(epoch, batches, len(loader), monitor)
            except torch.OutOfMemoryError:
                if self.dist.active:  # every rank would have to halve together: stop instead
                    raise
                del batches
                loader = self._halve_batch(epoch)
                batches = iter(loader)
                continue
            self.scheduler.step()
            if self.dist.active:  # DDP keeps replicas identical; a spread above 0 means a desynchronised run
                row["rank_param_spread"] = distributed.spread(self.dist, _param_sum(self.model))
            if main:
                final = epoch in (cfg.epochs - 1, end_epoch - 1)
                self._end_epoch(epoch, row, val_loader if (epoch + 1) % cfg.val_interval == 0 or final else None, log)
            distributed.barrier(self.dist)  # the others wait for rank 0's validation and checkpoint
            epoch += 1
        if not main:
            return {"run_dir": None, "rank": self.dist.rank}
        if not (self.dir / "weights" / "best.pt").exists() and (self.dir / "weights" / "last.pt").exists():
            save_checkpoint(self.dir / "weights" / "best.pt", self.ema.ema, self._meta(epoch - 1, {}))
        log.close()
        rows = log.rows()
        if self.per_class is not None:
            summary["per_class"] = self.per_class
        summary.update(
            run_dir=str(self.dir),
            epochs=[r["epoch"] for r in rows],
            last=rows[-1] if rows else {},
            skipped_steps=int(self.skipped.item()),
            peak_memory_gib=monitor.peak_gib(),
        )
        return summary

    def _end_epoch(self, epoch: int, row: dict, val_loader, log: RunLog) -> None:
        """Rank 0: validate the EMA model (when val_loader is given), checkpoint, write the log row."""
        fitness = -1.0
        if val_loader is not None:
            res = evaluate(self.ema.ema, val_loader, self.device)
            row.update(map=res["map"], map50=res["map50"])
            fitness = 0.1 * res["map50"] + 0.9 * res["map"]
            if epoch == self.cfg.epochs - 1:
                (self.dir / "val_per_class.txt").write_text(format_table(res) + "\n")
                self.per_class = res["per_class"]
        self._save(epoch, row, fitness)
        log.write(row)
        tqdm.write("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))

    def train_one_epoch(self, epoch: int, batches, nb: int, monitor: GpuMonitor) -> dict:
        """nb batches from the run's batch iterator; returns the epoch's log row (mean losses, rates)."""
        cfg, hyp, d = self.cfg, self.hyp, self.dist
        self.model.train()
        nw = max(round(hyp.warmup_epochs * nb), 100) if hyp.warmup_epochs > 0 else -1  # official minimum: 100
        accumulate = self._accumulate()
        mloss = torch.zeros(3, device=self.device)
        self.optimizer.zero_grad(set_to_none=not self.step.graphs)  # a captured backward owns the gradients
        bad_losses = torch.zeros((), dtype=torch.int64, device=self.device)  # read once, after the epoch
        t_epoch, t_wait, seen = time.perf_counter(), 0.0, 0
        bar = tqdm(total=nb, desc=f"epoch {epoch + 1}/{cfg.epochs}", dynamic_ncols=True, disable=not self.main)
        with bar:
            for i in range(nb):
                t0 = time.perf_counter()
                imgs, _, targets, _, _ = next(batches)
                t_wait += time.perf_counter() - t0
                ni = i + nb * epoch
                if ni <= nw:
                    target = cfg.accumulate or cfg.nbs / self.batch
                    accumulate = warmup(self.optimizer, ni, nw, self.lf(epoch), hyp, target)
                step = ni - self.last_opt_step >= accumulate
                # gradients of accumulation steps stay local; the optimizer step's backward all-reduces them
                loss, items = self.step.micro(imgs, targets, sync=step)
                bad_losses += ~torch.isfinite(loss)
                mloss = (mloss * i + torch.where(torch.isfinite(items), items, mloss)) / (i + 1)
                seen += imgs.shape[0] * d.world
                if step:
                    self.skipped += self.step.step()
                    self.last_opt_step = ni
                if self.main and (i % 10 == 0 or i == nb - 1):
                    el = time.perf_counter() - t_epoch
                    b, c, dfl = mloss.tolist()
                    bar.set_postfix_str(
                        f"box {b:.3f} cls {c:.3f} dfl {dfl:.3f} | {seen / el:.0f} img/s | "
                        f"data {100 * t_wait / el:.0f}% | {monitor.read()}"
                    )
                bar.update(1)
        el = time.perf_counter() - t_epoch
        if int(bad_losses):
            tqdm.write(f"warning: {int(bad_losses)} non-finite losses in epoch {epoch + 1}; their steps were skipped")
        box, cls, dfl = distributed.mean(d, mloss).tolist()
        return {
            "epoch": epoch,
            "box": box,
            "cls": cls,
            "dfl": dfl,
            "lr": self.optimizer.param_groups[0]["lr"],
            "images_per_s": seen / el,
            "data_wait": t_wait / el,
            "mosaic": epoch < self.train_ds.mosaic_until and hyp.mosaic > 0,
            "batch": self.batch,
        }

    def _halve_batch(self, epoch: int):
        """After CUDA ran out of memory: the same epoch again at half the batch (a captured graph is dropped)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.step.reset()
        torch.cuda.empty_cache()
        if self.batch == 1:
            raise torch.OutOfMemoryError("CUDA out of memory at batch 1")
        self.batch //= 2
        tqdm.write(f"warning: CUDA out of memory; batch halved to {self.batch}, restarting epoch {epoch + 1}")
        return self._loader(epoch)

    # --- checkpoints ------------------------------------------------------------------------------------------
    def _meta(self, epoch: int, row: dict) -> dict:
        return {
            "epoch": epoch,
            "map": row.get("map"),
            "map50": row.get("map50"),
            "data": self.data_name,
            "img_size": self.cfg.img,
        }

    def training_state(self, epoch: int) -> dict:
        """Everything --resume needs to continue exactly after `epoch` (read back in _setup)."""
        return {
            "config": asdict(self.cfg),
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "ema_updates": self.ema.updates,
            "epoch": epoch,
            "best_fitness": self.best,
            "batch": self.batch,
            "rng": rng_state(),
        }

    def _save(self, epoch: int, row: dict, fitness: float) -> None:
        """Rank 0: last.pt with the training state, best.pt when the fitness improved."""
        improved = fitness > self.best
        self.best = max(self.best, fitness)
        meta = self._meta(epoch, row)
        save_checkpoint(self.dir / "weights" / "last.pt", self.ema.ema, meta, train=self.training_state(epoch))
        if improved:
            save_checkpoint(self.dir / "weights" / "best.pt", self.ema.ema, meta)
