"""The `yolov9` command: one entry point whose subcommands live with the package that does the work
(train/ for models, training and validation; export/ for engines, prediction and inference benchmarks;
serve/ for Triton, the gateway and load tests)."""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys


def _quickstart(args: argparse.Namespace) -> None:
    """The main job on embedded defaults: train on coco128, then serve the result and answer one request."""
    import torch

    from serve.cli import serve_once
    from train.trainer import TrainConfig, Trainer

    gpu = torch.cuda.is_available()
    cfg = TrainConfig(
        data=args.data,
        cfg="yolov9-s" if gpu else "gelan-t",
        img=640 if gpu else 320,
        epochs=args.epochs or (30 if gpu else 3),
        batch=16,
        workers=min(8, os.cpu_count() or 1),
        close_mosaic=1,
        name="quickstart",
        cache="ram",
    )
    print(
        f"quickstart: training {cfg.cfg} at {cfg.img} px for {cfg.epochs} epochs on {cfg.data} "
        f"({'GPU' if gpu else 'CPU'})"
    )
    run = Trainer(cfg).fit()["run_dir"]
    if not gpu:  # three CPU epochs leave scores near 1e-4: ask that low so the answer shows the pipeline's boxes
        print(
            "note: a 3-epoch CPU model scores about 1e-4; the request below uses conf=0.0001. Train longer (on a "
            "GPU) for real detections."
        )
    serve_once(f"{run}/weights/best.pt", port=args.port, img=cfg.img, conf=0.25 if gpu else 0.0001)


def build_parser() -> argparse.ArgumentParser:
    from export import cli as export_cli
    from serve import cli as serve_cli
    from train import commands as train_commands

    p = argparse.ArgumentParser(prog="yolov9", description="Train, export, serve and load-test YOLOv9 detectors.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    bench = sub.add_parser("bench", help="benchmarks (train step, inference engines, serving pipeline)").add_subparsers(
        dest="bench", required=True, metavar="WHAT"
    )
    q = sub.add_parser(
        "quickstart",
        help="train on coco128, then serve the model and answer one request",
        description="The main job on embedded defaults: train (gelan-t at 320 px for 3 epochs on a "
        "CPU, yolov9-s at 640 px for 30 epochs on a GPU), then start Triton and the "
        "gateway on loopback, send one image, print the detections and stop.",
    )
    q.add_argument(
        "--data", default="coco128", help="dataset (default: coco128 from ../shared/datasets or $YOLOV9_DATASETS)"
    )
    q.add_argument("--epochs", type=int, default=None, help="override the number of epochs")
    q.add_argument("--port", type=int, default=8080, help="gateway port")
    q.set_defaults(func=_quickstart)
    train_commands.register(sub, bench)
    export_cli.register(sub, bench)
    serve_cli.register(sub, bench)
    return p


def main(argv: list[str] | None = None) -> int:
    # a crash inside native code (an engine's runtime, a CUDA library) then names the Python call it came from
    faulthandler.enable()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        # user-facing errors (bad file, bad input, missing dependency) end in one line, not a traceback
        if "YOLOV9_DEBUG" in os.environ:
            raise
        print(f"yolov9 {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
