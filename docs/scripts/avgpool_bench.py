"""The 2x2 stride-1 average pool of AConv/ADown, the pooling operator against the shifted sums that GPU training
uses: forward plus backward of one training step's calls at the shapes each model feeds it (fp16, channels-last).
Usage on a GPU machine, from the checkout: PYTHONPATH=. python docs/scripts/avgpool_bench.py OUT.json"""

import json
import sys

import torch
import torch.nn.functional as F

from yolov9.core.model import DetectionModel
from yolov9.core.modules import AConv, ADown, _ShiftAvgPool2x2


def pool_inputs(cfg: str) -> list[tuple[int, ...]]:
    model = DetectionModel(cfg, nc=80).cuda().eval()
    shapes: list[tuple[int, ...]] = []
    blocks = [m for m in model.modules() if isinstance(m, (ADown, AConv))]
    hooks = [m.register_forward_hook(lambda m, i, o: shapes.append(tuple(i[0].shape))) for m in blocks]
    with torch.no_grad():
        model(torch.zeros(1, 3, 640, 640, device="cuda"))
    for h in hooks:
        h.remove()
    return shapes


def step_ms(fn, shapes: list[tuple[int, ...]], batch: int, iters: int = 10) -> float:
    total = 0.0
    for s in shapes:
        x = torch.randn((batch, *s[1:]), device="cuda", dtype=torch.half)
        x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
        y = fn(x)
        g = torch.randn_like(y)
        y.backward(g)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            fn(x).backward(g)
        end.record()
        torch.cuda.synchronize()
        total += start.elapsed_time(end) / iters
    return total


def main() -> None:
    native = lambda t: F.avg_pool2d(t, 2, 1, 0, False, True)
    rows = []
    for cfg, batch in (("gelan-s", 128), ("yolov9-s", 16), ("yolov9-s", 128)):
        shapes = pool_inputs(cfg)
        rows.append(
            {
                "cfg": cfg,
                "batch": batch,
                "calls_per_step": len(shapes),
                "ms_per_step_native": round(step_ms(native, shapes, batch), 2),
                "ms_per_step_shifted": round(step_ms(_ShiftAvgPool2x2.apply, shapes, batch), 2),
            }
        )
        print(json.dumps(rows[-1]))
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
