"""The detection thresholds every path uses unless told otherwise: predict, the server and its gateway, load tests
and exports with NMS inside. Torch-free, so the gateway can import it."""

from dataclasses import dataclass

CONF = 0.25  # score threshold
IOU = 0.45  # NMS IoU threshold
MAX_DET = 100  # detections per image
MAX_DET_LIMIT = 1000  # the most a request may ask for


def threshold_problem(conf: float, iou: float, max_det: int, classes: list[int] | None = None) -> str | None:
    """What is wrong with one request's parameters, in one line, or None. The server checks every request it is
    sent (a NaN IoU would otherwise fail the whole batch it was put in); the gateway's query model states the same
    bounds, so its clients never reach this."""
    if not 0.0 <= conf <= 1.0:  # NaN fails every comparison
        return f"conf {conf} is not in [0, 1]"
    if not 0.0 < iou <= 1.0:
        return f"iou {iou} is not in (0, 1]"
    if not 1 <= max_det <= MAX_DET_LIMIT:
        return f"max_det {max_det} is not in [1, {MAX_DET_LIMIT}]"
    if classes and min(classes) < 0:
        return f"class id {min(classes)} is negative"
    return None


def require_thresholds(conf: float, iou: float, max_det: int, classes: list[int] | None = None) -> None:
    """threshold_problem as the one-line error of a command's options."""
    from yolov9.core.errors import BadInput

    if problem := threshold_problem(conf, iou, max_det, classes):
        raise BadInput(problem)


@dataclass(frozen=True)
class Thresholds:
    """What NMS keeps: boxes scoring above conf, overlapping less than iou, at most max_det per image."""

    conf: float = CONF
    iou: float = IOU
    max_det: int = MAX_DET
