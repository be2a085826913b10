"""`yolov9 quickstart`: the main job on embedded defaults. Train on coco128 (or the shipped coco48 where no dataset
root holds coco128), then serve the trained model and answer one request."""

from __future__ import annotations

import argparse
import os

from yolov9.core.detection_defaults import CONF


def quickstart(args: argparse.Namespace) -> dict:
    import torch

    from yolov9.serve.stack import serve_once
    from yolov9.train.config import TrainConfig
    from yolov9.train.trainer import Trainer

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
        f"quickstart: training {cfg.cfg} at {cfg.img} px for {cfg.epochs} epochs on {cfg.data or 'the default data'} "
        f"({'GPU' if gpu else 'CPU'})"
    )
    run = Trainer(cfg).fit()["run_dir"]
    if not gpu:  # three CPU epochs leave scores near 1e-4: ask that low so the answer shows the pipeline's boxes
        print(
            "note: a 3-epoch CPU model scores about 1e-4; the request below uses conf=0.0001. Train longer (on a "
            "GPU) for real detections."
        )
    return serve_once(f"{run}/weights/best.pt", port=args.port, conf=CONF if gpu else 0.0001)


def register(sub) -> None:
    q = sub.add_parser(
        "quickstart",
        help="train on coco128, then serve the model and answer one request",
        description="The main job on embedded defaults: train (gelan-t at 320 px for 3 epochs on a CPU, yolov9-s at "
        "640 px for 30 epochs on a GPU), then start Triton and the gateway on loopback, send one image, print the "
        "detections and stop.",
    )
    q.add_argument(
        "--data",
        default=None,
        help="dataset (default: coco128 from $YOLOV9_DATASETS or ../shared/datasets, else the shipped coco48)",
    )
    q.add_argument("--epochs", type=int, default=None, help="override the number of epochs")
    q.add_argument("--port", type=int, default=8080, help="gateway port")
    q.set_defaults(func=quickstart)
