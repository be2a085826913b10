"""Does the compiled loss compile again when a batch's padded box count grows? Runs one model's forward (autocast)
and `CompiledLoss` with its backward for batches of 3, 40, 100, 200 and again 100 boxes (capacities 64, 64, 128,
256, 128), printing each call's seconds, dynamo's graph count and the compile counters. With TORCH_LOGS=recompiles
dynamo names the guard that failed.

    TORCH_LOGS=recompiles PYTHONPATH=. python3 docs/scripts/loss_recompile_probe.py yolov9-s 16 [640 cuda]
    (a CPU check: ... gelan-t 2 64 cpu)"""

import sys
import time

import torch
from torch._dynamo.utils import counters

from yolov9.core.model import DetectionModel
from yolov9.train.compiled import CompiledLoss, cache_counts
from yolov9.train.loss import DetectionLoss


def main(cfg: str, batch: int, img: int, device: torch.device) -> None:
    model = DetectionModel(cfg, nc=80).to(device).train().to(memory_format=torch.channels_last)
    loss = CompiledLoss(DetectionLoss.for_model(model))
    x = torch.rand(batch, 3, img, img, device=device).contiguous(memory_format=torch.channels_last)
    amp = torch.float16 if device.type == "cuda" else torch.bfloat16
    for boxes in (3, 40, 100, 200, 100):  # all in the first image
        rows = torch.cat([torch.zeros(boxes, 1), torch.randint(0, 80, (boxes, 1)), torch.rand(boxes, 2) * 0.6 + 0.2,
                          torch.rand(boxes, 2) * 0.3 + 0.05], 1).float().to(device)  # fmt: skip
        t = time.perf_counter()
        with torch.autocast(device.type, dtype=amp):
            preds = model(x)
        loss(preds, rows)[0].backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        graphs = counters["stats"]["unique_graphs"]
        print(f"boxes {boxes}: {time.perf_counter() - t:.1f} s, unique graphs {graphs}, {cache_counts()}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:] + ["yolov9-s", "16", "640", "cuda"][len(sys.argv) - 1 :]
    main(args[0], int(args[1]), int(args[2]), torch.device(args[3]))
