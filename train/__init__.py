"""Model family, data, loss and trainer of yolov9-trt. `load_model` is the entry point for users and scripts.

The two names load lazily (PEP 562), so a torch-free module of this package (train/image_io.py, which the gateway
uses) can be imported without loading torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from train.checkpoint import load_model
    from train.model import DetectionModel

__all__ = ["load_model", "DetectionModel"]


def __getattr__(name: str):
    if name == "load_model":
        from train.checkpoint import load_model

        return load_model
    if name == "DetectionModel":
        from train.model import DetectionModel

        return DetectionModel
    raise AttributeError(f"module 'train' has no attribute {name!r}")
