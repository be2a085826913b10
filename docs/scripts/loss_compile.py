"""The compiled loss with a static box count (one compile per padded capacity) against a symbolic one (one compile
per run, train/compiled.py): compile seconds at each capacity of target rows in turn and the steady milliseconds of
the loss's forward and backward at each, on a model's real training output. Writes JSON.
Usage, from the checkout: PYTHONPATH=. python docs/scripts/loss_compile.py OUT.json [CFG] [BATCH] [IMG] [DEVICE]
(defaults gelan-s 128 640 cuda; a CPU check: ... /tmp/lc.json gelan-t 2 64 cpu). Each mode compiles into its own
fresh inductor cache folder, so both are cold."""

import json
import sys
import tempfile
import time

import torch

from yolov9.core.model import DetectionModel
from yolov9.train.data.targets import pad_rows
from yolov9.train.loss import DetectionLoss

CAPACITIES = (1024, 2048, 4096, 8192)  # rows over the batch (a mosaic batch of 128 has about 2,000)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _targets(batch: int, boxes: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(boxes)
    rows = torch.cat([torch.arange(boxes)[:, None] * batch // boxes, torch.randint(0, 80, (boxes, 1), generator=g),
                      torch.rand(boxes, 2, generator=g) * 0.6 + 0.2, torch.rand(boxes, 2, generator=g) * 0.2 + 0.02],
                     1).float()  # fmt: skip
    return rows.to(device)


def run_mode(dynamic: bool, cfg: str, batch: int, img: int, device: torch.device) -> dict:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = DetectionModel(cfg).to(device).train()
    loss = DetectionLoss.for_model(model)
    terms = torch.compile(loss.terms, dynamic=False, fullgraph=True)
    with torch.autocast(device.type, enabled=device.type == "cuda"):
        heads = loss.heads(model(torch.rand(batch, 3, img, img, device=device)))
    heads = [[f.detach().requires_grad_() for f in h] for h in heads]
    consts = loss.constants(heads[0])
    rows = []
    for cap in CAPACITIES:
        gt = pad_rows(_targets(batch, cap // 2, device), cap)  # half the capacity real rows, in image order
        if dynamic:
            torch._dynamo.mark_dynamic(gt, 0)
        _sync(device)
        t0 = time.perf_counter()
        terms(heads, gt, *consts)[0].backward()
        _sync(device)
        first = time.perf_counter() - t0
        for _ in range(3):
            terms(heads, gt, *consts)[0].backward()
        _sync(device)
        t0, n = time.perf_counter(), 20
        for _ in range(n):
            terms(heads, gt, *consts)[0].backward()
        _sync(device)
        rows.append({"capacity": cap, "first_call_s": round(first, 2),
                     "ms_per_call": round(1000 * (time.perf_counter() - t0) / n, 3),
                     "graphs_so_far": counters["stats"]["unique_graphs"]})  # fmt: skip
        print(("symbolic" if dynamic else "static"), rows[-1], flush=True)
    return {"box_count": "symbolic" if dynamic else "static", "rows": rows}


def main() -> None:
    import os

    out, cfg, batch, img, dev = (sys.argv[1:] + ["gelan-s", "128", "640", "cuda"][len(sys.argv) - 2 :])[:5]
    batch, img, device = int(batch), int(img), torch.device(dev)
    modes = []
    for dynamic in (False, True):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
        modes.append(run_mode(dynamic, cfg, batch, img, device))
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result = {"cfg": cfg, "batch": batch, "img": img, "device": name, "torch": torch.__version__, "modes": modes}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
