"""One engine interface for val, predict, bench and the server: PyTorch (eager), ONNX Runtime (.onnx),
AOTInductor (.pt2) and TensorRT (.plan). Every engine takes a float batch (B, 3, H, W) in [0, 1] on its device
and returns decoded predictions (B, 4 + nc, anchors) in the official layout. Each format's module holds its
exporter and its engine; this one picks and opens them."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from yolov9.core.checkpoint import load_model, read_checkpoint
from yolov9.core.coco_names import COCO_NAMES
from yolov9.core.device import select_device
from yolov9.core.errors import BadInput, MissingInput
from yolov9.export.metadata import EngineMeta

ENGINE_SUFFIXES = {".onnx": "onnx", ".pt2": "aoti", ".plan": "trt", ".engine": "trt"}
DEFAULT_IMG = 640  # a zoo model or an official checkpoint that records no training size


class Engine(Protocol):
    kind: str
    names: list[str]
    img_size: int
    device: torch.device
    dtype: torch.dtype  # the dtype the engine wants its input in

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def load_engine(
    spec: str | Path, device: str = "auto", half: bool | None = None, img_size: int | None = None
) -> Engine:
    """An engine from a file (.onnx/.pt2/.plan), a checkpoint, a config or a zoo name. An engine file runs at the
    size it was exported for; PyTorch weights at `img_size`, else the size they were trained at.

    device 'auto' means CUDA when present. For a checkpoint, `spec` may also be 'auto:WEIGHTS', which picks the
    fastest engine on this machine: a sibling .plan (TensorRT present), a sibling .pt2 (CUDA), PyTorch fp16 on
    CUDA, else a sibling .onnx (ONNX Runtime), else PyTorch fp32 on the CPU."""
    dev = select_device(device)
    spec = str(spec)
    if spec.startswith("auto:"):
        return load_engine(pick_fastest(Path(spec[5:]), dev), device, half, img_size)
    path = Path(spec)
    kind = ENGINE_SUFFIXES.get(path.suffix)
    if kind is not None and not path.is_file():
        raise MissingInput(f"{path}: no such engine file")
    if kind == "onnx":
        from yolov9.export.onnx_export import OnnxEngine

        engine = OnnxEngine(path)
    elif kind == "aoti":
        from yolov9.export.aoti import AOTIEngine

        engine = AOTIEngine(path, dev)
    elif kind == "trt":
        from yolov9.export.tensorrt import TensorRTEngine

        engine = TensorRTEngine(path)
    else:
        from yolov9.export.torch_engine import TorchEngine

        size = img_size or weights_meta(spec).img_size
        return TorchEngine(load_model(spec), dev, half=dev.type == "cuda" if half is None else half, img_size=size)
    if img_size and img_size != engine.img_size:
        raise BadInput(f"{path} was exported for {engine.img_size} px, not {img_size}: drop --img or export again")
    return engine


def weights_meta(spec: str | Path) -> EngineMeta:
    """What a spec holds without building an engine: names, image size and training data of an engine file or a
    checkpoint (our checkpoints record the training size; others run at 640), COCO's for a zoo name."""
    path = Path(spec)
    if path.suffix == ".onnx" and path.is_file() and not EngineMeta.path_for(path).is_file():
        import onnx  # an ONNX file carries the same metadata inside: parse it only without the sidecar
        from google.protobuf.message import DecodeError

        try:
            proto = onnx.load(str(path), load_external_data=False)
        except DecodeError as e:
            raise BadInput(f"{path}: not an ONNX model (its protobuf does not parse: {e})") from None
        return EngineMeta.from_props({p.key: p.value for p in proto.metadata_props}, path)
    if path.suffix in ENGINE_SUFFIXES:
        return EngineMeta.read(path)
    if path.is_file():
        ckpt = read_checkpoint(path)
        meta = ckpt.get("meta", {})
        size = int(meta.get("img_size") or DEFAULT_IMG)
        return EngineMeta(ckpt["names"], size, [], source=str(path), data=meta.get("data"))
    return EngineMeta(list(COCO_NAMES), DEFAULT_IMG, [], source=str(spec))


def engine_spec(engine: str | None, weights: str | None) -> str:
    """The --engine / WEIGHTS pair of val and predict as one load_engine() spec ('auto' picks the fastest)."""
    if engine == "auto":
        if not weights:
            raise BadInput("--engine auto needs WEIGHTS to look for exported engines beside")
        return f"auto:{weights}"
    spec = engine or weights
    if not spec:
        raise BadInput("give WEIGHTS or --engine")
    return spec


def pick_fastest(weights: Path, dev: torch.device) -> str:
    cuda = dev.type == "cuda"
    candidates = []
    if cuda:
        try:
            import tensorrt  # noqa: F401

            candidates.append(weights.with_suffix(".plan"))
        except ImportError:
            pass
        candidates.append(weights.with_suffix(".pt2"))
    if not cuda:
        candidates.append(weights.with_suffix(".onnx"))
    for c in candidates:
        if c.exists() and c != weights:
            return str(c)
    return str(weights)
