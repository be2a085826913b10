"""Peak host memory and time of one task-aligned assignment at a training batch's size, on the CPU.

    PYTHONPATH=<checkout> python docs/scripts/assigner_memory.py --batch 128 --boxes 60 [--max-elements N]

Run in a fresh process per measurement (ru_maxrss only grows). The anchors are those of a 640 px image (8,400);
boxes is the number of box rows per image (30% of them all-zero padding), batch * boxes rows in all. Prints one JSON
line."""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from yolov9.train.loss import TaskAlignedAssigner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128, help="images")
    ap.add_argument("--boxes", type=int, default=60, help="box rows per image")
    ap.add_argument("--max-elements", type=int, default=None, help="assigner chunk size (default: its own)")
    args = ap.parse_args()
    torch.manual_seed(0)
    b, n, nc = args.batch, args.boxes, 80
    grids = [torch.arange(s) + 0.5 for s in (80, 40, 20)]
    anchors = torch.cat(
        [torch.stack(torch.meshgrid(g, g, indexing="xy"), -1).view(-1, 2) * (640 / len(g)) for g in grids]
    )
    a = anchors.shape[0]
    centre, wh = torch.rand(b, a, 2) * 640, torch.rand(b, a, 2) * 200 + 2
    pd_bboxes = torch.cat((centre - wh / 2, centre + wh / 2), -1)
    centre, wh = torch.rand(b * n, 2) * 640, torch.rand(b * n, 2) * 300 + 4
    mask = (torch.rand(b * n, 1) > 0.3).float()
    gt_bboxes = torch.cat((centre - wh / 2, centre + wh / 2), -1) * mask
    labels = torch.randint(0, nc, (b * n, 1)).float() * mask
    image = torch.arange(b).repeat_interleave(n)
    pd_scores = torch.rand(b, a, nc)
    kw = {} if args.max_elements is None else {"max_elements": args.max_elements}
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    TaskAlignedAssigner(nc, **kw)(pd_scores, pd_bboxes, anchors, image, labels, gt_bboxes, mask)
    seconds = time.perf_counter() - t
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 2**20  # KiB -> GiB
    print(
        json.dumps(
            {
                "batch": b,
                "boxes": n,
                "anchors": a,
                "transient_peak_gib": round(peak, 2),
                "seconds": round(seconds, 1),
                **kw,
            }
        )
    )


if __name__ == "__main__":
    main()
