"""Subcommands of the training stage: convert, train and `bench train`."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from yolov9.core.errors import BadInput, Unavailable
from yolov9.core.options import add_options, from_namespace
from yolov9.train.config import BenchTrainConfig, TrainConfig, ignored_note, load_hyp


def _config(args: argparse.Namespace) -> TrainConfig:
    cfg = from_namespace(TrainConfig, args)
    if args.hyp_file:
        hyp, loss, ignored = load_hyp(args.hyp_file)
        if ignored:
            print(ignored_note(ignored))
        cfg = replace(cfg, hyp=hyp, loss=loss)
    return cfg


def _expandable_segments() -> None:
    """CUDA memory for training in expandable segments unless PYTORCH_CUDA_ALLOC_CONF says otherwise: a segment
    grows instead of new ones fragmenting, so less is reserved at the same speed (docs/benchmarks.md). Set before
    the process's first CUDA allocation, which reads it; torchrun's ranks inherit it."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def _train(args: argparse.Namespace) -> None:
    _expandable_segments()
    from yolov9.train import distributed
    from yolov9.train.trainer import Trainer

    devices = [d for d in (args.device or "").split(",") if d]
    if len(devices) > 1 and not distributed.under_torchrun():
        if not all(d.isdigit() for d in devices):
            raise BadInput(f"--device {args.device}: a list names CUDA indices, such as 0,1")
        code = distributed.launch(devices, distributed.with_device(args.argv, "auto"))
        if code:
            raise Unavailable(
                f"training stopped: a rank failed (torchrun exit code {code}, its output above); "
                f"weights/last.pt in the run folder holds the last completed epoch (continue with --resume)"
            )
        return
    try:
        summary = Trainer(_config(args)).fit()
    finally:
        distributed.close()
    if summary["run_dir"] is None:  # ranks other than 0 report nothing
        return
    last = summary.get("last", {})
    print(
        f"done: {summary['run_dir']}  mAP50-95 {last.get('map', float('nan')):.4f}  "
        f"mAP50 {last.get('map50', float('nan')):.4f}  weights in {summary['run_dir']}/weights"
    )


def _bench_train(args: argparse.Namespace) -> None:
    _expandable_segments()
    from yolov9.train.bench import bench_train

    bench_train(from_namespace(BenchTrainConfig, args))


def _convert(args: argparse.Namespace) -> None:
    from yolov9.core.checkpoint import convert, read_checkpoint

    out = convert(args.src, args.out)
    ck = read_checkpoint(out)
    print(f"wrote {out} ({ck['cfg'].get('name')}, {len(ck['model'])} tensors, {len(ck['names'])} classes)")


def register(sub, bench) -> None:
    s = sub.add_parser(
        "convert",
        help="official checkpoint -> this project's checkpoint format",
        description="Read an official YOLOv9 release checkpoint without executing code from it and "
        "write it in this project's format (tensors + JSON-able config).",
    )
    s.add_argument("src", help="official .pt checkpoint (or one of ours)")
    s.add_argument("out", help="output .pt path")
    s.set_defaults(func=_convert)

    s = sub.add_parser(
        "train",
        help="train a detector",
        description="Train a YOLOv9/GELAN detector with AMP. Every option is a field of "
        "yolov9.train.config.TrainConfig, so `Trainer(TrainConfig(...)).fit()` runs the same from Python. CUDA memory "
        "is allocated in expandable segments (less reserved, same speed) unless PYTORCH_CUDA_ALLOC_CONF is set.",
    )
    add_options(s, TrainConfig)
    s.add_argument(
        "--hyp",
        dest="hyp_file",
        default=None,
        metavar="YAML",
        help="hyper-parameters and loss gains (box, cls, dfl) over the hyp.scratch-high defaults: a flat mapping such "
        "as the official hyp.scratch-high.yaml; its keys that mean nothing here are named and ignored, unknown keys "
        "are refused",
    )
    s.set_defaults(func=_train)

    s = bench.add_parser(
        "train",
        help="steady-state training throughput",
        description="Time training steps on real data (no synthetic input): images/s, GPU busy %, "
        "data-wait share, warm-up time, training FLOPs per image and model FLOP utilisation, and peak memory (as "
        "torch allocated and reserved it, and as nvidia-smi shows it), for each --amp mode. Under torchrun each "
        "rank runs the step under DDP and rank 0 reports the images/s of all ranks together. Memory as `yolov9 train` "
        "allocates it (expandable segments unless PYTORCH_CUDA_ALLOC_CONF is set). A mode that runs out of GPU "
        "memory ends the bench with one line naming the batch, after writing --out with a row saying so.",
    )
    add_options(s, BenchTrainConfig)
    s.set_defaults(func=_bench_train)
