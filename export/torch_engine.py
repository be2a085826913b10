"""The PyTorch engine: the deployed (re-parameterized, fused) model run eagerly, fp16 or fp32."""

from __future__ import annotations

import torch

from yolov9.core.model import DetectionModel


class TorchEngine:
    kind = "torch"

    def __init__(
        self, model: DetectionModel, device: str | torch.device = "cpu", half: bool = False, img_size: int = 640
    ):
        self.device = torch.device(device)
        self.dtype = torch.float16 if half else torch.float32
        self.model = model.deploy().to(self.device, self.dtype)
        if self.device.type == "cuda":  # channels-last lets cuDNN pick its fastest fp16 kernels
            self.model = self.model.to(memory_format=torch.channels_last)
            torch.backends.cudnn.benchmark = True  # inference shapes repeat (batch buckets): time algorithms once
        self.names, self.img_size = model.names, img_size

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        return self.model(x.to(self.device, self.dtype)).float()
