"""What Triton's python backend runs: decode encoded images (nvJPEG on the GPU), letterbox on the device,
one engine call for the whole dynamic batch, NMS on the device, fixed-size detections per image.
Importable and tested on its own; serve/triton/model.py only adapts Triton's request objects to it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from export.engine import load_engine
from train.preprocess import ImageError, decode_image, postprocess, prepare_batch, to_input


@dataclass
class Request:
    data: bytes
    conf: float = 0.25
    iou: float = 0.45
    max_det: int = 100
    classes: list[int] | None = None


class Detector:
    def __init__(self, engine_path: str, device: str = "auto", max_det: int = 100, img_size: int = 640):
        self.engine = load_engine(engine_path, device=device, img_size=img_size)
        self.device = self.engine.device
        self.max_det = max_det
        self.names = self.engine.names

    def warmup(self, batch: int = 1) -> None:
        x = torch.zeros(batch, 3, self.engine.img_size, self.engine.img_size, device=self.device)
        self.engine(x.to(self.engine.dtype))

    def __call__(self, requests: list[Request]) -> list[tuple[torch.Tensor, int] | ImageError]:
        """Per request: ((max_det, 6) x1, y1, x2, y2, score, class in original pixels, zero-padded; count) or the
        error that request's image raised (other requests in the batch still succeed)."""
        results: list = [None] * len(requests)
        images, ok = [], []
        for k, r in enumerate(requests):
            try:
                images.append(decode_image(r.data, self.device))
                ok.append(k)
            except ImageError as e:
                results[k] = e
        if images:
            batch, metas = prepare_batch(images, self.engine.img_size, self.device)
            pred = self.engine(to_input(batch, self.engine.dtype))
            for j, k in enumerate(ok):
                r = requests[k]
                det = postprocess(
                    pred[j : j + 1], metas[j : j + 1], r.conf, r.iou, min(r.max_det, self.max_det), r.classes
                )[0]
                out = torch.zeros(self.max_det, 6, device=det.device, dtype=torch.float32)
                out[: len(det)] = det.float()
                results[k] = (out, len(det))
        return results
