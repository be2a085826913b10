"""mAP of an engine on a dataset in a named protocol: the official one (the paper's table: rectangular batches,
multi-label NMS) or the deployment one (what predict and the server do: square letterbox of the original image,
one label per box). Used by `yolov9 val` and by the export commands' --data check."""

from __future__ import annotations

from dataclasses import dataclass

from export.engine import Engine
from train.data.dataset import DetectionDataset, build_loader
from train.data.formats import load_split, resolve_data
from train.validate import evaluate


@dataclass(frozen=True)
class Protocol:
    rect: bool = True  # rectangular batches (stride-aligned shapes per batch of sorted aspect ratios, pad 0.5)
    multi_label: bool = True  # every class above conf per box, not only the best one
    conf: float = 0.001
    iou: float = 0.7
    max_det: int = 300

    @property
    def name(self) -> str:
        kind = "official" if self.rect and self.multi_label else "deployment" if not self.rect else "mixed"
        parts = ["rectangular batches" if self.rect else "square letterbox of the original image"]
        parts.append("multi-label NMS" if self.multi_label else "one label per box")
        return f"{kind} protocol ({', '.join(parts)}; conf {self.conf:g}, IoU {self.iou:g}, at most {self.max_det})"


OFFICIAL = Protocol()
DEPLOYMENT = Protocol(rect=False, multi_label=False)


def load_val_split(data: str | None, split: str, img_size: int, protocol: Protocol) -> DetectionDataset:
    index = load_split(resolve_data(data), split)
    return DetectionDataset(index, img_size, augment=False, desc=split, original=not protocol.rect)


def score_engine(engine: Engine, ds: DetectionDataset, protocol: Protocol, batch: int = 32, workers: int = 4) -> dict:
    """pycocotools mAP50-95 / mAP50, per-class AP and images/s of one engine in one protocol."""
    if protocol.rect and engine.kind != "torch":
        raise ValueError(f"{engine.kind} engines take a fixed square input: use the deployment protocol (--square)")
    loader = build_loader(ds, batch, workers, False, rect=protocol.rect)
    res = evaluate(
        engine, loader, engine.device, engine.dtype, protocol.conf, protocol.iou, protocol.max_det,
        multi_label=protocol.multi_label,
    )  # fmt: skip
    return {**res, "engine": engine.kind, "protocol": protocol.name}
