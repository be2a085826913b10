"""Checkpoints: this project's format (tensors + a JSON-able config, read with `weights_only=True`) and the
official release format (a pickled DetectionModel), read without executing anything from the file.

Official pickles are read by torch's weights-only unpickler with the known official class paths mapped to inert
data holders; any other global (os.system, builtins.eval, ...) is refused with an error that names it.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch

from yolov9.core.coco_names import COCO_NAMES
from yolov9.core.errors import BadInput, Unavailable
from yolov9.core.model import DetectionModel, load_cfg, zoo_names

FORMAT = "yolov9-trt"
FORMAT_VERSION = 1


class CheckpointError(BadInput):
    """A checkpoint that cannot be read; the message is one line that names the file and the cause."""


class CheckpointWriteError(Unavailable):
    """A checkpoint that could not be written (full disk, no permission, file size limit)."""


class _Holder:
    """Receives the attribute dict of one pickled object and nothing else."""


_OFFICIAL_CLASSES = [
    "models.yolo.DetectionModel",
    "models.yolo.DDetect",
    "models.yolo.DualDDetect",
    "models.common.Conv",
    "models.common.AConv",
    "models.common.ADown",
    "models.common.ELAN1",
    "models.common.RepNCSPELAN4",
    "models.common.RepNCSP",
    "models.common.RepNBottleneck",
    "models.common.RepConvN",
    "models.common.SP",
    "models.common.SPPELAN",
    "models.common.Concat",
    "models.common.DFL",
    "models.common.Silence",
    "models.common.CBLinear",
    "models.common.CBFuse",
    "torch.nn.modules.activation.SiLU",
    "torch.nn.modules.batchnorm.BatchNorm2d",
    "torch.nn.modules.container.ModuleList",
    "torch.nn.modules.container.Sequential",
    "torch.nn.modules.conv.Conv2d",
    "torch.nn.modules.linear.Identity",
    "torch.nn.modules.pooling.MaxPool2d",
    "torch.nn.modules.upsampling.Upsample",
]
_HOLDERS = [(type(name.rsplit(".", 1)[1], (_Holder,), {"path": name}), name) for name in _OFFICIAL_CLASSES]
_SAFE_EXTRAS = [set, torch.Size]


def _numpy_globals() -> list:
    """The numpy scalar and dtype classes that torch suggests allowlisting for weights-only loading: an unstripped
    official checkpoint (an interrupted run's last.pt) stores best_fitness and a few hyper-parameters as numpy
    scalars. They rebuild plain values and run no code of the file's choosing."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    scalar = core.multiarray.scalar
    out = [(scalar, "numpy.core.multiarray.scalar"), (scalar, "numpy._core.multiarray.scalar"), np.dtype]
    return out + [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")]


def _read(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{path}: not a PyTorch checkpoint (not a torch.save zip archive; truncated or another format)"
        )
    try:
        with torch.serialization.safe_globals(_HOLDERS + _SAFE_EXTRAS + _numpy_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # the unpickler's errors are long; keep the part that names the cause
        msg = str(e)
        m = re.search(r"(?:GLOBAL|global) ([\w.]+)", msg)
        if m and m.group(1) not in {"None"}:
            raise CheckpointError(
                f"{path}: refused to load: it references '{m.group(1)}', which is not part of a "
                f"YOLOv9 checkpoint (nothing from the file was executed)"
            ) from None
        first = msg.strip().splitlines()[0] if msg.strip() else type(e).__name__
        raise CheckpointError(f"{path}: unreadable checkpoint ({first[:200]})") from None


def _state_dict(holder: _Holder, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    d = holder.__dict__
    skip = d.get("_non_persistent_buffers_set", set())
    for k, v in {**d.get("_parameters", {}), **d.get("_buffers", {})}.items():
        if v is not None and k not in skip:
            out[prefix + k] = v.detach().clone() if isinstance(v, torch.Tensor) else v
    for name, child in d.get("_modules", {}).items():
        if child is not None:
            out.update(_state_dict(child, f"{prefix}{name}."))
    return out


def _from_official(obj: dict, path: Path) -> dict:
    net = obj.get("ema") or obj.get("model")
    if not isinstance(net, _Holder) or getattr(net, "path", "") != "models.yolo.DetectionModel":
        raise CheckpointError(f"{path}: no official DetectionModel under 'model' or 'ema'")
    d = net.__dict__
    cfg = d.get("yaml")
    if not isinstance(cfg, dict) or "backbone" not in cfg:
        raise CheckpointError(f"{path}: the official model carries no layer config ('yaml')")
    cfg = {k: v for k, v in cfg.items() if k in ("nc", "depth_multiple", "width_multiple", "backbone", "head", "ch")}
    cfg["name"] = Path(str(d.get("yaml_file", path.stem))).stem
    names = d.get("names", None)
    if isinstance(names, dict):
        names = [str(names[i]) for i in sorted(names)]
    state = {k: v.float() if v.is_floating_point() else v for k, v in _state_dict(net).items()}
    return _ours(cfg, state, names, meta={"source": "official", "file": path.name, "epoch": obj.get("epoch")})


def _ours(cfg: dict, state: dict, names: list[str] | None, meta: dict | None = None) -> dict:
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "cfg": cfg,
        "names": list(names or []),
        "model": state,
        "meta": meta or {},
    }


def read_checkpoint(path: str | Path) -> dict:
    """Either format as this project's checkpoint dict (format, cfg, names, model state dict, meta, ...)."""
    path = Path(path)
    obj = _read(path)
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        return obj
    if isinstance(obj, dict) and ("model" in obj or "ema" in obj):
        return _from_official(obj, path)
    raise CheckpointError(f"{path}: not a YOLOv9 checkpoint (no 'model' entry)")


def model_from_checkpoint(ckpt: dict, path: str | Path = "checkpoint") -> DetectionModel:
    cfg = ckpt["cfg"]
    try:
        model = DetectionModel(cfg, names=ckpt.get("names") or None)
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise CheckpointError(f"{path}: its layer config does not build: {e}") from None
    missing, unexpected = model.load_state_dict(ckpt["model"], strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not fit the config ({len(missing)} missing, "
            f"{len(unexpected)} unexpected, e.g. {(missing or unexpected)[0]})"
        )
    return model


def checkpoint_object(model: DetectionModel, meta: dict | None = None, **extra: Any) -> dict:
    """What `save_checkpoint` writes: the model's tensors copied to the CPU, its config, names and meta, and
    `extra` (training state for --resume). A copy: training may go on changing the model while it is written."""
    state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    obj = _ours(model.cfg, state, model.names, meta)
    obj.update(extra)
    return obj


def write_checkpoint(path: str | Path, obj: dict) -> Path:
    """Write atomically: into `path.tmp`, flushed and fsynced, then renamed over `path`, so a crash or a full
    disk leaves the previous file intact. A failed write removes its partial file and says which file and why."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except (OSError, RuntimeError) as e:  # torch's zip writer reports a failed write as a RuntimeError
        tmp.unlink(missing_ok=True)
        need, free = _tensor_bytes(obj), shutil.disk_usage(path.parent).free
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or free < need:
            why = f"no space left on the device (it needs about {need / 2**20:.0f} MiB, {free / 2**20:.0f} MiB free)"
        elif _file_size_limit() < need:
            why = (
                f"the process's file size limit (ulimit -f) is {_file_size_limit() / 2**20:.0f} MiB and it needs "
                f"about {need / 2**20:.0f} MiB"
            )
        elif isinstance(e, OSError) and e.errno:
            why = os.strerror(e.errno)
        else:
            why = str(e).strip().splitlines()[0]
        raise CheckpointWriteError(f"could not write {path}: {why}; the previous {path.name} is unchanged") from None
    return path


def _file_size_limit() -> float:
    try:
        import resource
    except ImportError:  # not on Unix
        return float("inf")
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return float("inf") if soft == resource.RLIM_INFINITY else float(soft)


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def save_checkpoint(path: str | Path, model: DetectionModel, meta: dict | None = None, **extra: Any) -> Path:
    """Write this project's format; `extra` holds training state (optimizer, EMA, RNG, ...) for --resume."""
    return write_checkpoint(path, checkpoint_object(model, meta, **extra))


def convert(src: str | Path, dst: str | Path) -> Path:
    """An official (or our own) checkpoint rewritten in this project's format."""
    ckpt = read_checkpoint(src)
    model = model_from_checkpoint(ckpt, src)
    return save_checkpoint(dst, model, meta={**ckpt.get("meta", {}), "converted_from": Path(src).name})


def load_model(source: str | Path | dict, nc: int | None = None) -> DetectionModel:
    """A float32 eval-mode model from an official checkpoint, one of ours, a config YAML or a zoo name. A config
    or zoo name builds an untrained model (random weights), and says so on stderr: release weights are not
    downloaded here, a trained checkpoint is passed as a file."""
    img_size = 640
    if isinstance(source, dict):
        model = DetectionModel(source, nc=nc)
    else:
        p = Path(source)
        if p.suffix in (".pt", ".pth", ".ckpt") or (p.is_file() and zipfile.is_zipfile(p)):
            ck = read_checkpoint(p)
            model = model_from_checkpoint(ck, p)
            img_size = int((ck.get("meta") or {}).get("img_size") or 640)
        elif p.suffix in (".yaml", ".yml") or str(source) in zoo_names():
            cfg = load_cfg(source)
            coco = (nc or cfg.get("nc")) == len(COCO_NAMES)  # the zoo's configs are COCO's 80 classes
            model = DetectionModel(cfg, nc=nc, names=COCO_NAMES if coco else None)
            print(
                f"note: {source} is a model config: an untrained model with random weights (pass a trained "
                f"checkpoint file for real detections)",
                file=sys.stderr,
            )
        else:
            raise CheckpointError(f"{source}: not a checkpoint, a YAML or a zoo name ({', '.join(zoo_names())})")
    model.img_size = img_size  # what predict() letterboxes to: the size it was trained at
    return model.float().eval()


def weights_source(weights: str | Path | DetectionModel) -> tuple[DetectionModel, str, str | None]:
    """A model to export, the file it came from and the dataset it was trained on (our checkpoints record it)."""
    if isinstance(weights, DetectionModel):
        return weights, "", None
    p = Path(weights)
    if p.is_file() and zipfile.is_zipfile(p):
        ckpt = read_checkpoint(p)
        return model_from_checkpoint(ckpt, p).float().eval(), str(p), ckpt.get("meta", {}).get("data")
    return load_model(weights), str(weights), None
