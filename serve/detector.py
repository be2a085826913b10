"""What Triton's python backend runs: decode encoded images (nvJPEG on the GPU), letterbox on the device,
one engine call for the whole dynamic batch, NMS on the device, fixed-size detections per image.
Importable and tested on its own; serve/triton/model.py only adapts Triton's request objects to it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from export.engine import load_engine
from train.preprocess import ImageError, decode_images, postprocess, prepare_batch, to_input


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
        error that request's image raised (other requests in the batch still succeed).

        The whole batch goes through one batched decode, one engine call and one NMS per distinct IoU value."""
        results: list = decode_images([r.data for r in requests], self.device)
        ok = [k for k, img in enumerate(results) if not isinstance(img, ImageError)]
        if not ok:
            return results
        batch, metas = prepare_batch([results[k] for k in ok], self.engine.img_size, self.device)
        pred = self.engine(to_input(batch, self.engine.dtype))
        for iou in sorted({requests[k].iou for k in ok}):
            rows = [j for j, k in enumerate(ok) if requests[k].iou == iou]
            reqs = [requests[ok[j]] for j in rows]
            dets = postprocess(
                pred[rows],
                [metas[j] for j in rows],
                [r.conf for r in reqs],
                iou,
                [min(r.max_det, self.max_det) for r in reqs],
                [r.classes for r in reqs],
            )
            for j, det in zip(rows, dets):
                out = torch.zeros(self.max_det, 6, device=det.device, dtype=torch.float32)
                out[: len(det)] = det.float()
                results[ok[j]] = (out, len(det))
        return results
