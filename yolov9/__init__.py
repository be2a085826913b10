"""yolov9-trt: the `yolov9` command (yolov9.cli) and the Python entry points. `load_model` loads lazily (PEP 562)
so that `yolov9 --help` does not wait for torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.checkpoint import load_model
    from core.model import DetectionModel

__all__ = ["load_model", "DetectionModel"]


def __getattr__(name: str):
    if name == "load_model":
        from core.checkpoint import load_model

        return load_model
    if name == "DetectionModel":
        from core.model import DetectionModel

        return DetectionModel
    raise AttributeError(f"module 'yolov9' has no attribute {name!r}")
