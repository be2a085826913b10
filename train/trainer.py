"""The trainer: `Trainer(TrainConfig).fit()` sets up data, model and training state (train/state.py), then per
epoch runs `train_one_epoch` (train/engine.py), validates the EMA model, writes the checkpoints in the background and
one log row; at the end it writes the plots and prints the per-class table. The step keeps the GPU fed: uint8
batches cross the bus and are normalised on the device, targets arrive as rows over the batch, and no step waits for
the host."""

from __future__ import annotations

import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import torch
import yaml
from torch.utils.data import DataLoader
from tqdm import tqdm

from yolov9.core.checkpoint import read_checkpoint
from yolov9.core.errors import BadInput
from yolov9.core.model import DetectionModel, load_cfg
from yolov9.train import distributed, plots
from yolov9.train.compiled import (
    FORWARD_MODES,
    CompiledForward,
    cache_counts,
    compiled_before,
    import_compiler,
    loss_compiled,
    note_compiled,
    resolve_mode,
    signature,
)
from yolov9.train.config import TrainConfig
from yolov9.train.data.dataset import (
    Batch,
    Cache,
    DetectionDataset,
    EpochBatchSampler,
    eval_loader,
    run_batches,
    train_loader,
)
from yolov9.train.data.formats import DatasetIndex, load_split, require_boxes, resolve_data
from yolov9.train.data.pinned import close_batches
from yolov9.train.ema import ModelEMA
from yolov9.train.engine import (
    EpochPlan,
    TrainStep,
    accumulation,
    accumulation_target,
    step_module,
    train_one_epoch,
    warmup_iterations,
)
from yolov9.train.gpu_monitor import GpuMonitor
from yolov9.train.loss import DetectionLoss
from yolov9.train.prewarm import prewarm
from yolov9.train.run_log import RunLog
from yolov9.train.state import CheckpointWriter, TrainState, epoch_checkpoints, resume_config
from yolov9.train.step import (
    StepOptions,
    amp_dtype,
    build_optimizer,
    cudnn_benchmark,
    forward_backward,
    heuristic_convolutions,
    make_scaler,
)
from yolov9.train.validate import evaluate, format_table

VAL_BATCH_MAX = 32  # a larger batch validates no faster and adds memory beside the training step's


def val_batch(train_batch: int) -> int:
    """The batch of validation during training: twice the training batch, as the official trainer's, up to 32."""
    return min(2 * train_batch, VAL_BATCH_MAX)


def lr_lambda(epochs: int, lrf: float, cosine: bool):
    if cosine:
        return lambda x: ((1 - math.cos(x * math.pi / epochs)) / 2) * (lrf - 1) + 1
    return lambda x: (1 - x / epochs) * (1.0 - lrf) + lrf


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


def _device_line(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({os.cpu_count()} cores)"


class Trainer:
    def __init__(self, cfg: TrainConfig):
        # seconds from the process's start to each stage of the set-up, for the first epoch's row
        self.startup = {"imports": _seconds_since_process_start()}
        self.resume_ck = None
        if cfg.resume:
            cfg, self.resume_ck = resume_config(cfg)
        self.dist = distributed.init(cfg.device or "auto")
        self.device, self.main = self.dist.device, self.dist.main
        cfg, filled = cfg.resolved(self.device.type == "cuda")
        self.cfg = cfg
        if self.main:
            self._notes(filled)
        if cfg.batch != -1 and cfg.batch % self.dist.world:
            raise BadInput(f"--batch {cfg.batch} is the global batch: it must divide by the {self.dist.world} ranks")
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        self.amp_dtype = amp_dtype(cfg.amp, self.device)
        spec, train_index = self._index()
        self.model = self._build_model().to(self.device)
        self._img_to_stride()
        if cfg.channels_last and self.device.type == "cuda":
            self.model = self.model.to(memory_format=torch.channels_last)
        if cfg.sync_bn and self.dist.active:
            if self.device.type != "cuda":
                raise BadInput("--sync-bn needs CUDA GPUs (SyncBatchNorm has no CPU kernels)")
            self.model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(self.model)
        # the run's length in training images, which the defaults of cuDNN's timing and --compile weigh their
        # start-up costs against (from the index: the choice is made before the images are checked)
        self.run_images = cfg.epochs * len(train_index.images)
        # the input size is fixed, so cuDNN can time its algorithms once per shape: in a run long enough to pay
        self.cudnn_timing = self.device.type == "cuda" and cudnn_benchmark(cfg.cudnn_benchmark, self.run_images)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = self.cudnn_timing
        self.dir: Path | None = None
        self.startup["model"] = _seconds_since_process_start()
        self.prewarm_parts: dict[str, float] | None = None
        self.started: tuple[DataLoader, Iterator[Batch]] | None = None  # the loader started beside the warm-up
        self._choice: tuple[int, tuple[dict, bool, str]] | None = None  # _compile_choice's, for the batch it was for
        if self._prewarms():  # the images are cached and the loader started in a thread while this one warms the GPU
            # (the thread starts once the warm-up's copy of the model is made)
            _beside(lambda: self._datasets_and_loader(spec, train_index), self._prewarm)
        else:
            self._datasets(spec, train_index)
        self.startup["datasets"] = _seconds_since_process_start()

    def _notes(self, filled: list[str]) -> None:
        cfg = self.cfg
        if filled and self.device.type == "cpu":
            verb = "defaults" if len(filled) == 1 else "default"
            print(
                f"note: no GPU, so {', '.join('--' + k for k in filled)} {verb} to a CPU run that ends in minutes "
                f"({cfg.cfg}, {cfg.img} px, {cfg.epochs} epochs); on a GPU the defaults are yolov9-s, 640 px, 100 "
                "epochs"
            )
        cores = os.cpu_count() or 1
        if cfg.workers > cores:
            print(f"note: --workers {cfg.workers} capped at the {cores} CPU cores of this machine")
            self.cfg.workers = cores

    def _img_to_stride(self) -> None:
        """--img rounded up to a multiple of the model's largest stride, as the official trainer does: every
        feature map then covers the image exactly, and the exported engine takes the same size."""
        stride = int(self.model.stride.max())
        if self.cfg.img % stride:
            img = math.ceil(self.cfg.img / stride) * stride
            if self.main:
                print(f"note: --img {self.cfg.img} is not a multiple of the model's stride {stride}: training at {img}")
            self.cfg.img = img

    def _index(self) -> tuple[dict, DatasetIndex]:
        """The data's spec and the training split's index (its files and class names), before any image is read."""
        cfg = self.cfg
        spec = resolve_data(cfg.data)
        # what `val` without --data reads back from the checkpoint: a name, or an absolute path
        self.data_name = (
            str(Path(cfg.data).resolve()) if cfg.data and Path(cfg.data).exists() else str(cfg.data or spec["root"])
        )
        train_index = require_boxes(load_split(spec, "train"), spec, "train", cfg.allow_empty)
        self.names = train_index.names
        return spec, train_index

    def _prewarms(self) -> bool:
        """Whether to warm the GPU up before the first step: on one GPU with a known batch (--batch -1's memory
        trials would see the copy's; a multi-GPU run's data set-up synchronises the ranks, so it stays in order)."""
        cfg = self.cfg
        return cfg.prewarm and self.device.type == "cuda" and cfg.batch > 0 and not self.dist.active

    def _prewarm(self, start_data: Callable[[], None]) -> None:
        cfg = self.cfg
        opts = StepOptions(self.amp_dtype, cfg.channels_last, clip=cfg.clip)
        self.prewarm_parts, error = prewarm(self.model, cfg.batch, cfg.img, opts, cfg.loss, then=start_data)
        self.startup["prewarm"] = _seconds_since_process_start()
        if error and self.main:
            print(f"note: warming the GPU up failed ({error}); the first step warms it instead")

    def _datasets_and_loader(self, spec: dict, train_index: DatasetIndex) -> None:
        """The datasets, then the training loader's workers: they build the first batches while the GPU warms up, so
        the first epoch starts with batches waiting instead of waiting for each worker's first whole batch."""
        # decoding and NMS need torchvision, which the modules import at first use: here it is imported beside the
        # warm-up, off the way to the first step, and before the workers fork, so that they inherit it
        import torchvision  # noqa: F401

        self.startup["data_imports"] = _seconds_since_process_start()
        self._datasets(spec, train_index)
        self.startup["data_ready"] = _seconds_since_process_start()  # checked and cached; then the workers start
        saved = self.resume_ck["train"] if self.resume_ck is not None else {"epoch": -1, "batch": self.cfg.batch}
        self.started = self._loader(saved["epoch"] + 1, saved["batch"])
        self.startup["loader"] = _seconds_since_process_start()
        if self._compile_choice(self.cfg.batch)[2] != "off":  # after the workers' fork: no held import lock in them
            import_compiler()
            self.startup["compiler_imports"] = _seconds_since_process_start()

    def _datasets(self, spec: dict, train_index: DatasetIndex) -> None:
        cfg = self.cfg
        cache = Cache(cfg.cache, cfg.workers, self.dist) if cfg.cache else None
        self.train_ds = DetectionDataset(train_index, cfg.img, cfg.hyp, cache, cfg.seed, desc="train")
        # as officially, mosaic closes when the run reaches epochs - close_mosaic: never, in a shorter run (set before
        # the loader's workers fork, which copy the dataset)
        self.train_ds.mosaic_until = cfg.epochs - cfg.close_mosaic if cfg.close_mosaic <= cfg.epochs else cfg.epochs
        # validation runs on rank 0 alone, so only rank 0 loads (and caches) the validation split
        self.val_ds = None
        if cfg.val and self.main:
            val_index = require_boxes(load_split(spec, "val"), spec, "val", cfg.allow_empty)
            self.val_ds = DetectionDataset(val_index, cfg.img, cache=cache, desc="val")
        if self.main:
            for ds in filter(None, (self.train_ds, self.val_ds)):
                print(ds.describe())
            print(self.train_ds.problems.summary())

    def _build_model(self) -> DetectionModel:
        nc = len(self.names)
        if self.resume_ck is not None:
            model = DetectionModel(self.resume_ck["cfg"], names=self.names)
            model.load_state_dict(self.resume_ck["train"]["model"])
            return model
        if self.cfg.weights:
            ck = read_checkpoint(self.cfg.weights)
            model = DetectionModel(ck["cfg"], nc=nc, names=self.names)
            own = model.state_dict()
            fit = {k: v for k, v in ck["model"].items() if k in own and own[k].shape == v.shape}
            model.load_state_dict(fit, strict=False)
            self.weights_note = f"{len(fit)}/{len(own)} tensors from {self.cfg.weights}" + (
                f" (class outputs re-initialised for {nc} classes)" if len(fit) < len(own) else ""
            )
            return model
        return DetectionModel(load_cfg(self.cfg.cfg), nc=nc, names=self.names)

    def auto_batch(self) -> int:
        """Largest batch that fits in about 85% of GPU memory, from the memory of two trial batches."""
        if self.device.type != "cuda":
            print("--batch -1: no GPU, using 16")
            return 16
        loss_fn = DetectionLoss.for_model(self.model, self.cfg.loss)
        no_scaling = make_scaler(self.device, None)
        used = []
        sizes = (4, 8)
        for b in sizes:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            imgs = torch.randint(0, 256, (b, 3, self.cfg.img, self.cfg.img), dtype=torch.uint8)
            opts = StepOptions(self.amp_dtype, self.cfg.channels_last)
            forward_backward(self.model, imgs, torch.zeros(b, 1, 5), loss_fn, no_scaling, opts)
            self.model.zero_grad(set_to_none=True)
            used.append(torch.cuda.max_memory_allocated(self.device))
        per = (used[1] - used[0]) / (sizes[1] - sizes[0])
        total = torch.cuda.get_device_properties(self.device).total_memory
        batch = int((0.85 * total - (used[0] - per * sizes[0])) // max(per, 1))
        batch = max(1, min(batch, 1024) // 8 * 8 or batch)
        print(f"--batch -1: using batch {batch} ({per / 2**20:.0f} MiB per image)")
        return batch

    # --- set-up -----------------------------------------------------------------------------------------------
    def _setup(self) -> None:
        """The training state (restored when resuming) and the step that trains it."""
        cfg, hyp = self.cfg, self.cfg.hyp
        batch = self.auto_batch() * self.dist.world if cfg.batch == -1 else cfg.batch  # global
        self.loss_fn = DetectionLoss.for_model(self.model, cfg.loss)
        decay = hyp.weight_decay * batch * accumulation(cfg.nbs, batch, cfg.accumulate) / cfg.nbs
        optimizer = build_optimizer(self.model, cfg.optimizer, hyp.lr0, hyp.momentum, decay)
        self.lf = lr_lambda(cfg.epochs, hyp.lrf, cfg.cos_lr)
        self.state = TrainState(
            model=self.model,
            ema=ModelEMA(self.model) if self.main else None,  # rank 0 alone validates and saves it
            optimizer=optimizer,
            scaler=make_scaler(self.device, self.amp_dtype),
            scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=self.lf),
            batch=batch,
            skipped=torch.zeros((), device=self.device),
        )
        if self.resume_ck is not None:
            self.state.load_state_dict(self.resume_ck["train"], self.resume_ck["model"])
            if self.main:
                print(f"resuming from epoch {self.state.epoch + 2} of {cfg.epochs}")
        self._make_step()

    def _compile_choice(self, batch: int) -> tuple[dict, bool, str]:
        """For a step of `batch` images (global): the compile's signature (the run's record of it), whether this
        machine compiled it before, and --compile's mode. Made once per batch: the warm-up's data thread asks first
        (whether to import the compiler), the step's set-up again (another batch after --batch -1)."""
        if self._choice is None or self._choice[0] != batch:
            cfg = self.cfg
            sig = signature(
                self.model, batch // self.dist.world, cfg.img, self.amp_dtype, channels_last=cfg.channels_last,
                loss=cfg.compile_loss, graphs=cfg.cuda_graph,
            )  # fmt: skip
            before = compiled_before(sig)
            mode = resolve_mode(cfg.compile, self.device, self.dist.active, self.run_images, before, self._background)
            self._choice = batch, (sig, before, mode)
        return self._choice[1]

    @property
    def _background(self) -> bool:
        return self.cfg.compile_background and not self.dist.active  # see StepOptions

    def _make_step(self) -> None:
        cfg, st = self.cfg, self.state
        self.compile_sig, self.compiled_before, mode = self._compile_choice(st.batch)
        opts = StepOptions(
            self.amp_dtype, cfg.channels_last, self.dist.world, cfg.clip, cfg.cuda_graph, mode, cfg.compile_loss,
            self._background, self.compiled_before,
        )  # fmt: skip
        net = step_module(self.model, opts, self.dist)
        self.step = TrainStep(self.model, net, self.loss_fn, st.optimizer, st.scaler, st.ema, opts)
        if cfg.cuda_graph and self.dist.active and self.main:
            print("note: a multi-GPU run trains eagerly (CUDA graphs need one GPU; see --help)")

    def _loader(self, start_epoch: int, batch: int) -> tuple[DataLoader, Iterator[Batch]]:
        """The training loader from `start_epoch` on and its batches, its workers started. Each rank takes its share
        of every global batch: the same images per step as one process would take."""
        d = self.dist
        per_rank = batch // d.world
        # the first batch in one part per worker: the workers build it side by side
        split = self.cfg.workers if self.cfg.workers > 1 else 1
        sampler = EpochBatchSampler(
            len(self.train_ds), per_rank, self.cfg.seed, (d.rank, d.world), start_epoch, first_split=split
        )
        loader = train_loader(self.train_ds, sampler, self.cfg.workers)
        return loader, run_batches(loader, pin=self.device)

    def _running_loader(self, epoch: int) -> tuple[DataLoader, Iterator[Batch]]:
        """The loader started beside the warm-up if it starts where the state does, else a new one."""
        started, self.started = self.started, None
        if started is not None:
            sampler = started[0].batch_sampler
            if (sampler.start_epoch, sampler.batch) == (epoch, self.state.batch // self.dist.world):
                return started
            close_batches(started[1])
        return self._loader(epoch, self.state.batch)

    def _plan(self, loader) -> EpochPlan:
        cfg, batch = self.cfg, self.state.batch
        target = accumulation_target(cfg.nbs, batch, cfg.accumulate)
        return EpochPlan(cfg.epochs, len(loader), warmup_iterations(cfg.hyp, len(loader)), target, cfg.hyp, self.lf)

    # --- the run ----------------------------------------------------------------------------------------------
    def fit(self) -> dict:
        cfg, main = self.cfg, self.main
        self._setup()
        self.startup["step_setup"] = _seconds_since_process_start()
        epoch = self.state.epoch + 1
        loader, running = self._running_loader(epoch)
        val_loader, log, self.writer = None, None, CheckpointWriter()
        self.plots = plots.BackgroundPlots(background=self.device.type == "cuda")
        if self.val_ds is not None:
            pin = self.device.type == "cuda"
            val_loader = eval_loader(self.val_ds, val_batch(self.state.batch), cfg.workers, pin=pin)
        if main:
            self.dir = new_run_dir(cfg.project, cfg.name, cfg.exist_ok)
            (self.dir / "args.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            (self.dir / "data_problems.txt").write_text(self.train_ds.problems.summary(full=True) + "\n")
            log = RunLog(self.dir)
            self.best_written = (self.dir / "weights" / "best.pt").exists()
            print(self._header(loader))
            if self.resume_ck is None:
                self.plots.submit(plots.plot_labels, self.train_ds.labels, self.names, out=self.dir / "labels.jpg")
        monitor, self.final = GpuMonitor(self.device), None
        end_epoch = cfg.epochs if cfg.stop_after is None else min(cfg.epochs, epoch + cfg.stop_after)
        batches = self._plotting(running, epoch)  # one iterator: workers prefetch across epochs
        first_epoch = True
        try:
            while epoch < end_epoch:
                started = _seconds_since_process_start()
                try:
                    row = train_one_epoch(self.state, self.step, batches, self._plan(loader), epoch, self.dist, monitor)
                except torch.OutOfMemoryError:
                    if self.dist.active:  # every rank would have to halve together: stop instead
                        raise
                    close_batches(running)
                    loader, running = self._halve_batch(epoch)
                    batches = running
                    continue
                self.state.scheduler.step()
                self.state.epoch = epoch
                if first_epoch:  # what a user waits before training starts: caching, capture, compilation
                    row["start_to_first_step_s"] = started + row["first_step_s"]
                    row["startup_s"] = {  # a timeline: each stage's end, in seconds from the process's start
                        **{k: round(v, 2) for k, v in self.startup.items()},
                        "epoch_start": round(started, 2),
                        "first_batch": round(started + row["first_batch_s"], 2),
                        "first_step": round(row["start_to_first_step_s"], 2),
                    }
                    if self.prewarm_parts is not None:  # beside the "datasets" stage, in another thread
                        row["prewarm_s"] = round(sum(self.prewarm_parts.values()), 3)
                        row["prewarm_parts_s"] = self.prewarm_parts
                    if self.step.opts.compile != "off":
                        row.update(cache_counts())
                    row["cudnn_benchmark"] = self.cudnn_timing
                    first_epoch = False
                self._background_compile(row)
                self._note_compiled(row)
                row.update(mosaic=epoch < self.train_ds.mosaic_until and cfg.hyp.mosaic > 0, batch=self.state.batch)
                if self.dist.active:  # DDP keeps replicas identical; a spread above 0 means a desynchronised run
                    row["rank_param_spread"] = distributed.spread(self.dist, _param_sum(self.model))
                if main:
                    final = epoch in (cfg.epochs - 1, end_epoch - 1)
                    validate = (epoch + 1) % cfg.val_interval == 0 or final
                    self._end_epoch(epoch, row, val_loader if validate else None, log, final)
                distributed.barrier(self.dist)  # the others wait for rank 0's validation and checkpoint
                epoch += 1
        finally:
            self.step.close()
            self.writer.close()
            close_batches(running)
            for failure in self.plots.close():
                print(f"note: a picture was not drawn ({failure})")
        if not main:
            return {"run_dir": None, "rank": self.dist.rank}
        return self._finish(log, monitor)

    def _note_compiled(self, row: dict) -> None:
        """Once the compiled forward has trained (after the first epoch, or when the background compiles of every
        part took over, so that inductor's cache holds them all): the record the next run reads (--compile auto's
        choice, and a background compile with no second process)."""
        net = self.step.net
        ready = all(part.ready for part in self.step.background)
        if isinstance(net, CompiledForward) and ready and not getattr(self, "_compile_noted", False):
            self._compile_noted = True
            note_compiled(self.compile_sig, row.get("compile_s"))

    def _background_compile(self, row: dict) -> None:
        """With --compile-background: whether the compiled forward and loss have taken over (and torch.compile's
        counts so far), whether their second processes have ended, and once each, why its compile failed."""
        parts = {("forward" if isinstance(p, CompiledForward) else "loss"): p for p in self.step.background}
        if not parts:
            return
        row.update({f"{name}_compiled": p.ready for name, p in parts.items()}, **cache_counts())
        row.update({f"{name}_cache_filled": p.filled for name, p in parts.items() if p.fill is not None})
        noted = self.__dict__.setdefault("_background_noted", set())
        for name, p in parts.items():
            if p.failure:
                note = f"compiling the {name} in the background failed ({p.failure}); it stays uncompiled"
            elif p.notice:
                note = f"the {name} compiles from the cache at the takeover, not beside the run ({p.notice})"
            else:
                continue
            if self.main and name not in noted:
                noted.add(name)
                tqdm.write(f"note: {note}")

    def _plotting(self, batches, epoch: int):
        """The batch iterator, drawing the first three batches of a new run as trained (train_batch0-2.jpg)."""
        for k, batch in enumerate(batches):
            if k < 3 and epoch == 0 and self.main and self.resume_ck is None:
                # copies of the images drawn: the batch's own (pinned) memory goes back to the allocator after its step
                images = batch.images[: plots.BATCH_TILES].clone()
                boxes = plots.training_batch_boxes(batch.rows, len(images), batch.images.shape[2:])
                self.plots.submit(plots.plot_batch, images, boxes, self.names, out=self.dir / f"train_batch{k}.jpg")
            yield batch

    def _end_epoch(self, epoch: int, row: dict, val_loader, log: RunLog, final: bool) -> None:
        """Rank 0: validate the EMA model (when val_loader is given), checkpoint, write the log row."""
        fitness = -1.0
        if val_loader is not None:
            t0 = time.perf_counter()
            # at the training's precision on a GPU, as the official trainer validates; fp32 on the CPU, where bf16
            # autocast is slow without the instructions for it
            amp = self.amp_dtype if self.device.type == "cuda" else None
            with heuristic_convolutions():
                res = evaluate(self.state.ema.ema, val_loader, loss_fn=self.loss_fn, plots=final, amp=amp)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()  # validation's blocks: the training step does not reuse them
            keys = ("precision", "recall", "map50", "map", "val_box", "val_cls", "val_dfl")
            keys += ("detections", "nms_s", "score_s")  # what the epoch's end costs, beside val_s
            row.update({k: res[k] for k in keys if k in res}, val_s=time.perf_counter() - t0)
            fitness = 0.1 * res["map50"] + 0.9 * res["map"]
            if final:
                self.final = res
        improved = fitness > self.state.best_fitness
        self.state.best_fitness = max(self.state.best_fitness, fitness)
        meta = {"epoch": epoch, "map": row.get("map"), "map50": row.get("map50"), "data": self.data_name}
        meta.update(img_size=self.cfg.img, epochs=self.cfg.epochs, cfg=self.cfg.cfg)
        write_best = improved or (final and not self.best_written)  # a run without validation keeps its last
        self.best_written |= write_best
        t0 = time.perf_counter()  # waiting for the previous epoch's checkpoint, then copying this one to the host
        self.writer.submit(epoch_checkpoints(self.dir, self.state, self.cfg, meta, write_best))
        row["checkpoint_s"] = time.perf_counter() - t0
        row = {**row, "epoch": epoch + 1}
        log.write(row)
        tqdm.write("  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))

    def _header(self, loader) -> str:
        cfg, st = self.cfg, self.state
        params = sum(p.numel() for p in self.model.parameters())
        source = (
            f"resumed from {cfg.resume}"
            if self.resume_ck is not None
            else getattr(self, "weights_note", None) or "from scratch"
        )
        acc = accumulation(cfg.nbs, st.batch, cfg.accumulate)
        amp = {None: "off (fp32)", torch.float16: "fp16", torch.bfloat16: "bf16"}[self.amp_dtype]
        g = st.optimizer.param_groups[1]  # the weights' group (biases and norms take no decay)
        graphs = "on" if self.step.graphs else "off"
        mode = self.step.opts.compile
        parts = [mode] if mode in FORWARD_MODES else []
        if loss_compiled(mode, cfg.compile_loss):
            parts += ["loss"]
        cached = " from this machine's cache" if mode in FORWARD_MODES and self.compiled_before else ""
        background = ", in the background" if self.step.opts.compile_background else ""
        compiled = f", compiled ({' and '.join(parts)}{background}){cached}" if parts else ""
        if cfg.compile == "auto" and not parts and resolve_mode("auto", self.device, self.dist.active) != "off":
            compiled = ", not compiled (a short run would not earn back the compile; --compile layers compiles)"
        timing = ""
        if self.device.type == "cuda":
            why = (
                " (a short run would not earn it back; --cudnn-benchmark times)" if cfg.cudnn_benchmark is None else ""
            )
            timing = ", cuDNN timing on" if self.cudnn_timing else f", cuDNN timing off{why}"
        lines = [
            f"run      {self.dir}",
            f"device   {_device_line(self.device)}" + (f" x {self.dist.world} ranks" if self.dist.active else ""),
            f"model    {cfg.cfg}, {params / 1e6:.2f}M parameters, {len(self.names)} classes, {source}",
            f"input    {cfg.img} px, batch {st.batch} x {acc} accumulated (nominal {cfg.nbs}), AMP {amp}, "
            f"CUDA graphs {graphs}{compiled}{timing}",
            f"optim    {cfg.optimizer} lr0 {cfg.hyp.lr0:g} lrf {cfg.hyp.lrf:g} momentum {cfg.hyp.momentum:g} "
            f"weight decay {g['weight_decay']:g} (scaled to the batch), {'cosine' if cfg.cos_lr else 'linear'} "
            f"schedule, warm-up {cfg.hyp.warmup_epochs:g} epochs",
            f"data     {len(self.train_ds)} training images, {len(loader)} batches per epoch, {cfg.workers} workers, "
            f"cache {cfg.cache or 'none'}",
            f"epochs   {cfg.epochs}, mosaic "
            + (f"off for the last {cfg.close_mosaic}" if cfg.close_mosaic <= cfg.epochs else "in every epoch")
            + (f", validation every {cfg.val_interval}" if cfg.val else ", no validation"),
        ]
        return "\n".join(lines)

    def _finish(self, log: RunLog, monitor: GpuMonitor) -> dict:
        """Rank 0 after the last epoch: plots, the per-class table, and the run's summary."""
        log.close()
        rows = log.rows()
        plots.plot_results(rows, self.dir / "results.png")
        summary = {}
        if self.final is not None:
            res = self.final
            (self.dir / "val_per_class.txt").write_text(format_table(res) + "\n")
            print(format_table(res))
            summary["per_class"] = res["per_class"]
            self._final_plots(res.pop("plots"))
        summary.update(
            run_dir=str(self.dir),
            epochs=[r["epoch"] for r in rows],
            last=rows[-1] if rows else {},
            skipped_steps=int(self.state.skipped.item()),
            peak_memory_gib=monitor.peak_gib(),
        )
        return summary

    def _final_plots(self, p: dict) -> None:
        d, names = self.dir, self.names
        if p["curves"] is not None:
            plots.plot_curves(p["curves"], names, d)
        plots.plot_confusion(p["confusion"], names, d / "confusion_matrix.png")
        plots.plot_confusion(p["confusion"], names, d / "confusion_matrix_normalized.png", normalize=True)
        if p["sample"] is not None:
            batch, found = p["sample"]
            from yolov9.train.validate import letterboxed_targets

            hw = batch.images.shape[2:]
            gts = plots.training_batch_boxes(letterboxed_targets(batch, hw), len(batch.images), hw)
            plots.plot_batch(batch.images, gts, names, d / "val_batch0_labels.jpg")
            preds = [_to_letterbox(det, m) for det, m in zip(found, batch.metas)]
            plots.plot_batch(
                batch.images, [x[x[:, 4] > 0.25] for x in preds], names, d / "val_batch0_pred.jpg", scores=True
            )

    def _halve_batch(self, epoch: int) -> tuple[DataLoader, Iterator[Batch]]:
        """After CUDA ran out of memory: the same epoch again at half the batch (a captured graph is dropped)."""
        self.state.optimizer.zero_grad(set_to_none=True)
        self.step.reset()
        torch.cuda.empty_cache()
        if self.state.batch == 1:
            raise torch.OutOfMemoryError("CUDA out of memory at batch 1")
        self.state.batch //= 2
        tqdm.write(f"warning: CUDA out of memory; batch halved to {self.state.batch}, restarting epoch {epoch + 1}")
        return self._loader(epoch, self.state.batch)


def _to_letterbox(det: torch.Tensor, meta) -> torch.Tensor:
    """Detections in original-image pixels -> the letterboxed input's pixels (to draw on the batch)."""
    out = det.clone()
    out[:, [0, 2]] = det[:, [0, 2]] * meta.ratio + meta.pad[0]
    out[:, [1, 3]] = det[:, [1, 3]] * meta.ratio + meta.pad[1]
    return out


def _beside(work: Callable[[], None], here: Callable[[Callable[[], None]], None]) -> None:
    """Runs `work` in a thread beside `here` on this one; raises `work`'s error. `here` is given the function that
    starts the thread, to call when its own interpreter-bound part is done (the thread starts when `here` returns
    at the latest). A plain thread, not an executor's: processes forked from an executor's thread (the loader's
    workers) exit with code 1, their copy of the executor's exit hook joining threads that the fork did not copy,
    and the loader reports them as crashed."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run, name="datasets")

    def start() -> None:
        if thread.ident is None:
            thread.start()

    try:
        here(start)
        start()
    finally:
        if thread.ident is not None:
            thread.join()
    if errors:
        raise errors[0]


def _seconds_since_process_start() -> float:
    return time.time() - psutil.Process().create_time()
