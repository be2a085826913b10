"""core/postprocess.batched_nms's chunk size: milliseconds of torchvision's batched_nms and of batched_nms with
chunks of several sizes, on candidate sets shaped like validation's (many (image, class) groups) and like one image's
(few large groups), each result checked to keep what torchvision keeps (integer boxes, so the offsets round alike;
equal scores may come out in another order). Chunk 1: one NMS per group.
Usage, from the checkout: PYTHONPATH=. python docs/scripts/nms_chunks.py {cpu,cuda} OUT.json"""

import json
import sys
import time
from functools import partial

import torch
import torchvision

from yolov9.core import postprocess
from yolov9.core.postprocess import batched_nms, nms_flat

CASES = ((2_000, 160), (6_000, 640), (30_000, 2_560), (200_000, 10_240), (30_000, 80), (100_000, 320))
CHUNKS = {"cpu": (1, 100, 250, 500), "cuda": (1, 1000, 2000, 4000, 8000, 25000)}


def candidates(n: int, groups: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n + groups)
    xy = (torch.rand(n, 2, generator=g) * 600).round()
    wh = (5 + torch.rand(n, 2, generator=g) * 80).round()
    key = torch.randint(0, groups, (n,), generator=g)
    return torch.cat((xy, xy + wh), 1).to(device), torch.rand(n, generator=g).to(device), key.to(device)


def ms(fn, device: str, repeat: int) -> tuple[float, torch.Tensor]:
    out = fn()  # the first call loads kernels
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / repeat * 1e3, out


def validation_batch(device: str) -> list[dict]:
    """nms_flat at validation's settings over a batch of 32 predictions with an untrained model's scores (every
    class between 0 and 0.02), with each chunk size."""
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(32, 2, 8400, generator=g) * 600
    pred = torch.cat(
        (xy, 8 + torch.rand(32, 2, 8400, generator=g) * 100, torch.rand(32, 80, 8400, generator=g) / 50), 1
    )
    pred, rows = pred.to(device), []
    for multi_label in (False, True):
        row = {"multi_label": multi_label, "chunk_ms": {}}
        for c in CHUNKS[device]:
            postprocess.NMS_WHOLE_MAX[device] = postprocess.NMS_CHUNK[device] = c
            row["chunk_ms"][c] = round(
                ms(partial(nms_flat, pred, 0.001, 0.7, 300, multi_label=multi_label), device, 2)[0], 1
            )
        rows.append(row)
        print(row, flush=True)
    return rows


def main(device: str, out: str) -> None:
    rows = []
    for n, groups in CASES:
        boxes, scores, key = candidates(n, groups, device)
        repeat = 3 if n > 50_000 else 5
        tv_ms, want = ms(partial(torchvision.ops.batched_nms, boxes, scores, key, 0.7), device, repeat)
        row = {"candidates": n, "groups": groups, "torchvision_ms": round(tv_ms, 2), "chunk_ms": {}, "same_kept": True}
        for c in CHUNKS[device]:
            t, got = ms(partial(batched_nms, boxes, scores, key, 0.7, chunk=c), device, repeat)
            row["chunk_ms"][c] = round(t, 2)
            row["same_kept"] &= torch.equal(got.sort().values, want.sort().values)
        rows.append(row)
        print(row, flush=True)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    with open(out, "w") as f:
        versions = {"torch": torch.__version__, "torchvision": torchvision.__version__}
        json.dump({"device": name, **versions, "rows": rows, "validation_batch": validation_batch(device)}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
