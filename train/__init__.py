"""Model family, data, loss and trainer of yolov9-trt. `load_model` is the entry point for users and scripts."""

from train.checkpoint import load_model
from train.model import DetectionModel

__all__ = ["load_model", "DetectionModel"]
