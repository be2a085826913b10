"""The detection thresholds every path uses unless told otherwise: predict, the server and its gateway, load tests
and exports with NMS inside. Torch-free, so the gateway can import it."""

from dataclasses import dataclass

CONF = 0.25  # score threshold
IOU = 0.45  # NMS IoU threshold
MAX_DET = 100  # detections per image


@dataclass(frozen=True)
class Thresholds:
    """What NMS keeps: boxes scoring above conf, overlapping less than iou, at most max_det per image."""

    conf: float = CONF
    iou: float = IOU
    max_det: int = MAX_DET
