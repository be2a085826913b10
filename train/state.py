"""The training state and its checkpoints. `TrainState` holds what --resume needs to continue exactly (model, EMA,
optimizer, scaler, LR schedule, the last optimizer step of the accumulation, best fitness, batch, torch RNG) and
round-trips through `state_dict()`; `CheckpointWriter` writes `weights/last.pt` (and `best.pt`) after each epoch in
a background thread, one write at a time; `resume_config` reads a run back."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from yolov9.core.checkpoint import checkpoint_object, read_checkpoint, write_checkpoint
from yolov9.core.errors import BadInput, MissingInput
from yolov9.core.model import DetectionModel
from yolov9.core.yaml_io import read_yaml
from yolov9.train.config import TrainConfig
from yolov9.train.ema import ModelEMA
from yolov9.train.step import load_optimizer_state


def _cpu_copy(obj):
    """A deep copy with every tensor on the CPU: the copy stays as it is while training changes the originals."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v) for v in obj)
    return obj


@dataclass
class TrainState:
    model: DetectionModel
    ema: ModelEMA | None  # rank 0 only
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    scheduler: torch.optim.lr_scheduler.LRScheduler
    batch: int
    epoch: int = -1  # the last completed epoch
    best_fitness: float = -1.0
    last_opt_step: int = -1  # the micro-batch (counted over the run) of the last optimizer step
    skipped: torch.Tensor = field(default_factory=lambda: torch.zeros(()))  # non-finite steps skipped

    def state_dict(self) -> dict:
        """A CPU copy of everything a resumed run needs (numpy's and Python's generators are not used by training:
        augmentation draws from generators seeded by (seed, epoch, index))."""
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return _cpu_copy(
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "ema_updates": self.ema.updates if self.ema is not None else 0,
                "epoch": self.epoch,
                "best_fitness": self.best_fitness,
                "batch": self.batch,
                "last_opt_step": self.last_opt_step,
                "rng": rng,
            }
        )

    def load_state_dict(self, st: dict, ema_weights: dict | None = None) -> None:
        """Restores what state_dict() saved (the model itself is built from st['model'] by the caller)."""
        load_optimizer_state(self.optimizer, st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        self.scaler.load_state_dict(st["scaler"])
        if self.ema is not None and ema_weights is not None:
            self.ema.load_state_dict({"model": ema_weights, "updates": st["ema_updates"]})
        self.epoch, self.best_fitness, self.batch = st["epoch"], st["best_fitness"], st["batch"]
        # runs saved before the accumulation position was kept resume as they did then
        self.last_opt_step = st.get("last_opt_step", -1)
        torch.set_rng_state(st["rng"]["torch"])
        if "cuda" in st["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(st["rng"]["cuda"])


class CheckpointWriter:
    """Writes checkpoints in a background thread, one at a time: the state is copied to the CPU at once (training
    goes on changing it), and torch.save and fsync overlap the next epoch. A failed write is raised by the next
    `submit` or by `close`."""

    def __init__(self):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, writes: list[tuple[Path, dict]]) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(writes,), daemon=True)
        self._thread.start()

    def _run(self, writes: list[tuple[Path, dict]]) -> None:
        try:
            for path, obj in writes:
                write_checkpoint(path, obj)
        except BaseException as e:  # handed to the training thread by wait()
            self._error = e

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    close = wait


def epoch_checkpoints(run_dir: Path, state: TrainState, config: TrainConfig, meta: dict, improved: bool) -> list:
    """(path, object) pairs for an epoch's end: last.pt with the training state, best.pt (EMA only) if improved."""
    ema = state.ema.ema
    last = checkpoint_object(ema, meta, train={**state.state_dict(), "config": config.to_dict()})
    writes = [(run_dir / "weights" / "last.pt", last)]
    if improved:
        writes.append((run_dir / "weights" / "best.pt", {k: v for k, v in last.items() if k != "train"}))
    return writes


def find_run(resume: str, project: str) -> Path:
    """The checkpoint --resume names: a run folder, its weights/last.pt, or 'latest' (the project's newest run)."""
    path = Path(project) / "latest" if resume == "latest" else Path(resume)
    if resume == "latest" and not path.exists():
        raise MissingInput(f"--resume: no run to resume in {project} (give a run folder or its weights/last.pt)")
    path = path.resolve()
    if path.is_dir():
        path = path / "weights" / "last.pt"
    if not path.is_file():
        raise MissingInput(f"--resume {resume}: {path} does not exist")
    return path


def resume_config(cfg: TrainConfig) -> tuple[TrainConfig, dict]:
    """The run's own config (its args.yaml when present, else the copy in the checkpoint) with this command's
    --stop-after, and its --device/--workers when given; and the checkpoint read."""
    ck_path = find_run(cfg.resume, cfg.project)
    ck = read_checkpoint(ck_path)
    if "train" not in ck:
        raise BadInput(
            f"{ck_path}: holds no training state to resume from (a final or converted checkpoint); start a new "
            f"run with --weights instead"
        )
    run_dir = ck_path.parents[1]
    args_yaml = run_dir / "args.yaml"
    saved = TrainConfig.from_dict(read_yaml(args_yaml) if args_yaml.is_file() else ck["train"]["config"])
    done = ck["train"]["epoch"] + 1
    if done >= saved.epochs:
        raise BadInput(
            f"{run_dir}: finished all {saved.epochs} epochs; nothing to resume (fine-tune from it with --weights "
            f"{run_dir / 'weights' / 'best.pt'}, or raise epochs: in {args_yaml.name} to train on)"
        )
    resumed = TrainConfig.from_dict(
        {
            **saved.to_dict(),
            "resume": str(ck_path),
            "stop_after": cfg.stop_after,
            "exist_ok": True,
            "name": run_dir.name,
            "project": str(run_dir.parent),
            "device": cfg.device if cfg.device is not None else saved.device,
            "workers": cfg.workers if cfg.workers is not None else saved.workers,
        }
    )
    return resumed, ck
