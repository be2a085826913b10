"""AOTInductor engine: the deployed model compiled ahead of time with torch.export + AOTInductor into a .pt2
package (fp16 on CUDA by default, dynamic batch) that loads without recompiling (export/engine.py AOTIEngine)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from export.engine import deploy_model, sidecar_path
from train import load_model
from train.model import DetectionModel


def export_aoti(
    weights: str | Path | DetectionModel,
    out: str | Path,
    img: int = 640,
    half: bool = True,
    device: str = "cuda",
    max_batch: int = 256,
    inductor_configs: dict | None = None,
) -> Path:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(
            "AOTInductor export for CUDA needs a CUDA GPU on this machine (use --device cpu for a CPU package)"
        )
    out = Path(out)
    src = weights if isinstance(weights, DetectionModel) else load_model(weights)
    dtype = torch.float16 if half else torch.float32
    model = deploy_model(src).to(device, dtype)
    x = torch.zeros(2, 3, img, img, device=device, dtype=dtype)
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    with torch.no_grad():
        ep = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch}})
        out.parent.mkdir(parents=True, exist_ok=True)
        options = dict(inductor_configs or {})  # a copy: the compile adds its own keys
        torch._inductor.aoti_compile_and_package(ep, package_path=str(out), inductor_configs=options)
    sidecar_path(out).write_text(
        json.dumps(
            {
                "names": src.names,
                "img_size": img,
                "strides": model.stride.tolist(),
                "dtype": str(dtype).split(".")[1],
                "device": device,
                "max_batch": max_batch,
                "inductor_configs": {k: repr(v) for k, v in (inductor_configs or {}).items()},
                "torch": torch.__version__,
                "input": "images: (B,3,H,W) RGB in [0,1], letterboxed with 114",
                "output": "(B, 4 + nc, anchors)",
            },
            indent=1,
        )
    )
    return out
