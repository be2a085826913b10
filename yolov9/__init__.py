"""yolov9-trt: the `yolov9` command (yolov9.cli), the stages (yolov9.core, .train, .export, .serve) and the Python
entry points. `load_model` and `DetectionModel` load lazily (PEP 562) so that `yolov9 --help` does not wait for
torch."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

# In the source tree the stages are folders beside this one (core/, train/, export/, serve/); an installed wheel
# holds them inside it. Searching the parent too makes `yolov9.core` resolve in the tree (PYTHONPATH=checkout).
_beside = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "core")) and os.path.isfile(
    os.path.join(_beside, "core", "__init__.py")
):
    __path__.append(_beside)

if TYPE_CHECKING:
    from yolov9.core.checkpoint import load_model
    from yolov9.core.model import DetectionModel

__all__ = ["load_model", "DetectionModel"]


def __getattr__(name: str):
    if name == "load_model":
        from yolov9.core.checkpoint import load_model

        return load_model
    if name == "DetectionModel":
        from yolov9.core.model import DetectionModel

        return DetectionModel
    raise AttributeError(f"module 'yolov9' has no attribute {name!r}")
