"""mAP of an engine on a dataset in a named protocol: the official one (the paper's table: rectangular batches,
multi-label NMS) or the deployment one (what predict and the server do: square letterbox of the original image,
one label per box). Used by `yolov9 val` and by the export commands' --data check."""

from __future__ import annotations

from yolov9.core.errors import BadInput
from yolov9.export.engine import Engine
from yolov9.train.data.dataset import DetectionDataset, eval_loader
from yolov9.train.data.formats import load_split, resolve_data
from yolov9.train.validate import DEPLOYMENT, OFFICIAL, Protocol, evaluate

__all__ = ["DEPLOYMENT", "OFFICIAL", "Protocol", "load_val_split", "score_engine"]


def load_val_split(data: str | None, split: str, img_size: int, protocol: Protocol) -> DetectionDataset:
    index = load_split(resolve_data(data), split)
    return DetectionDataset(index, img_size, desc=split, original=not protocol.rect)


def score_engine(engine: Engine, ds: DetectionDataset, protocol: Protocol, batch: int = 32, workers: int = 4) -> dict:
    """pycocotools mAP50-95 / mAP50, per-class AP and images/s of one engine in one protocol."""
    if protocol.rect and engine.kind != "torch":
        raise BadInput(f"{engine.kind} engines take a fixed square input: use the deployment protocol (--square)")
    loader = eval_loader(ds, batch, workers, rect=protocol.rect)
    res = evaluate(engine, loader, protocol)
    return {**res, "engine": engine.kind, "protocol": protocol.name}
