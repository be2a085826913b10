"""Prediction on images as `yolov9 predict` and `model.predict(...)` do it: decode (files, bytes, arrays, PIL
images), letterbox, run any model or engine, NMS, boxes mapped back to each original image. One `Detections` per
image; the same pre- and post-processing as validation and the server (core/preprocess.py, core/postprocess.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from yolov9.core.decode import decode_image
from yolov9.core.detection_defaults import Thresholds
from yolov9.core.image_io import detections_to_json
from yolov9.core.postprocess import per_image, postprocess_flat
from yolov9.core.preprocess import prepare_batch, to_input

Source = str | Path | bytes | np.ndarray | torch.Tensor  # or a PIL image


@dataclass
class Detections:
    """What was found in one image: boxes (n, 4) x1, y1, x2, y2 in its pixels, scores (n,), class ids (n,), the
    model's class names, and the image's (height, width) and where it came from."""

    boxes: torch.Tensor
    scores: torch.Tensor
    classes: torch.Tensor
    names: list[str]
    shape: tuple[int, int]
    source: str = ""
    image: torch.Tensor | None = field(default=None, repr=False)  # the decoded uint8 (3, H, W) image

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def labels(self) -> list[str]:
        """The class name of each detection."""
        return [self.names[int(c)] for c in self.classes]

    def rows(self) -> torch.Tensor:
        """(n, 6) x1, y1, x2, y2, score, class."""
        return torch.cat((self.boxes, self.scores[:, None], self.classes[:, None].float()), 1)

    def to_json(self) -> list[dict]:
        """The gateway's JSON form: box, score, class_id, class_name per detection."""
        return detections_to_json(self.rows(), self.names)


def _to_image(src, device) -> tuple[torch.Tensor, str]:
    """uint8 RGB (3, H, W) and a name for it."""
    if isinstance(src, (str, Path)):
        return decode_image(Path(src), device), str(src)
    if isinstance(src, bytes):
        return decode_image(src, device), "<bytes>"
    if isinstance(src, torch.Tensor):
        if src.dtype != torch.uint8 or src.ndim != 3 or src.shape[0] != 3:
            raise ValueError("a tensor image is uint8 (3, H, W), RGB")
        return src.to(device), "<tensor>"
    arr = np.asarray(src.convert("RGB")) if hasattr(src, "convert") else src  # a PIL image
    if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError("an array image is uint8 (H, W, 3), RGB (cv2.imread gives BGR: convert it first)")
    return torch.from_numpy(np.array(arr)).permute(2, 0, 1).to(device), "<array>"  # a copy: the caller keeps its own


@torch.no_grad()
def predict_images(
    engine: Callable[[torch.Tensor], torch.Tensor],
    images: Source | Iterable[Source],
    img_size: int,
    names: list[str],
    nms: Thresholds = Thresholds(),
    classes: list[int] | None = None,
) -> list[Detections]:
    """`engine` maps a float batch (B, 3, S, S) in [0, 1] to decoded predictions (a model in eval mode or any
    engine); it carries `device` and `dtype`, or its parameters tell them."""
    if isinstance(engine, torch.nn.Module):
        p = next(engine.parameters())
        device, dtype = p.device, p.dtype
    else:
        device, dtype = torch.device(engine.device), engine.dtype
    one = isinstance(images, (str, Path, bytes, np.ndarray, torch.Tensor)) or hasattr(images, "convert")
    out = []
    for src in [images] if one else images:
        im, name = _to_image(src, device)
        batch, metas = prepare_batch([im], img_size, device)
        pred = engine(to_input(batch, dtype))
        det = per_image(postprocess_flat(pred, metas, nms.conf, nms.iou, nms.max_det, classes))[0].cpu()
        h, w = im.shape[1:]
        out.append(Detections(det[:, :4], det[:, 4], det[:, 5].long(), list(names), (h, w), name, im.cpu()))
    return out
