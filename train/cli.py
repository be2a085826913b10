"""Subcommands of the training stage: info, convert, train and `bench train`."""

from __future__ import annotations

import argparse
from dataclasses import fields

from train.trainer import TrainConfig

_TRAIN_HELP = {
    "data": "dataset: YOLO/COCO/VOC dataset YAML, COCO instances JSON, VOC or YOLO folder, or a dataset name "
    "looked up in $YOLOV9_DATASETS, ../shared/datasets and ./datasets (default: coco128 there, else the shipped "
    "coco48; README 'Datasets' explains the YAML)",
    "cfg": "model config: zoo name (yolov9-t/s/m/c/e, gelan-t/s/m/c/e) or YAML path",
    "weights": "start from this checkpoint (official or ours); a different class count re-initialises class outputs",
    "img": "training and validation image size in pixels",
    "epochs": "number of epochs",
    "batch": "global batch size, split evenly across the ranks of a multi-GPU run (so LR, warm-up and accumulation "
    "stay those of one process with this batch); -1 picks the largest that fits each GPU",
    "nbs": "nominal batch size: gradients accumulate to about this many images per optimizer step",
    "accumulate": "override the accumulation steps computed from --nbs",
    "amp": "mixed precision: bf16, fp16 (with a gradient scaler) or off; auto is fp16 on a GPU (it measured faster "
    "than bf16 for every model and batch on an H200) and bf16 on the CPU",
    "optimizer": "SGD (official recipe) or AdamW",
    "cos_lr": "cosine LR schedule instead of linear",
    "clip": "gradient-norm clipping threshold",
    "close_mosaic": "turn mosaic off for the last N epochs",
    "cache": "keep decoded, resized images in 'ram' or on 'disk'",
    "workers": "data loader worker processes",
    "device": "auto, cpu, a CUDA index such as 0, or a list such as 0,1 for one process per GPU (started through "
    "torchrun's launcher; under an external torchrun each rank takes cuda:LOCAL_RANK)",
    "seed": "random seed (data order and augmentation are a function of seed, epoch and index)",
    "project": "folder of runs",
    "name": "run name (runs/train/NAME; a number is appended if it exists)",
    "exist_ok": "reuse the run folder if it exists",
    "val": "validate during training (--no-val to skip)",
    "val_interval": "validate every N epochs (and always at the end)",
    "stop_after": "stop after N epochs of this run while keeping the --epochs schedule (continue with --resume)",
    "resume": "continue a run exactly: its folder or its weights/last.pt",
    "channels_last": "channels-last memory format on the GPU",
    "sync_bn": "synchronise BatchNorm statistics across the GPUs of a multi-GPU run (SyncBatchNorm)",
    "cuda_graph": "on one GPU, capture each micro-batch's forward, loss and backward and the optimizer step (unscale, "
    "clip, SGD/AdamW, EMA) as CUDA graphs and replay them: one launch instead of thousands, faster at every batch "
    "size measured and most at small ones (docs/benchmarks.md); --no-cuda-graph trains eagerly. Warm-up steps run "
    "the optimizer eagerly (momentum ramps); a short last batch runs eagerly; a multi-GPU run stays eager (DDP's "
    "all-reduce hooks cannot be captured); ignored on the CPU",
    "cudnn_benchmark": "let cuDNN time its convolution algorithms for the fixed input size (faster; the chosen "
    "algorithms, and so the last bits of the results, may differ between runs)",
}


def _add_train_args(p: argparse.ArgumentParser) -> None:
    for f in fields(TrainConfig):
        if f.name == "hyp":
            continue
        default = f.default
        flag = "--" + f.name.replace("_", "-")
        if isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=_TRAIN_HELP[f.name])
        else:
            typ = (
                int
                if f.name
                in (
                    "img",
                    "epochs",
                    "batch",
                    "nbs",
                    "accumulate",
                    "close_mosaic",
                    "workers",
                    "seed",
                    "val_interval",
                    "stop_after",
                )
                else float
                if f.name == "clip"
                else str
            )
            kw = {"choices": ["auto", "bf16", "fp16", "off"]} if f.name == "amp" else {}
            kw = {"choices": ["ram", "disk"]} if f.name == "cache" else kw
            p.add_argument(flag, type=typ, default=default, help=_TRAIN_HELP[f.name], **kw)
    p.add_argument("--hyp", default=None, help="YAML of hyper-parameters overriding hyp.scratch-high defaults")


def _config(args: argparse.Namespace) -> TrainConfig:
    import yaml

    kw = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if f.name != "hyp"}
    hyp = yaml.safe_load(open(args.hyp)) if args.hyp else {}
    return TrainConfig(**kw, hyp=hyp or {})


def _train(args: argparse.Namespace) -> None:
    from train import distributed
    from train.trainer import Trainer

    devices = [d for d in args.device.split(",") if d]
    if len(devices) > 1 and not distributed.under_torchrun():
        if not all(d.isdigit() for d in devices):
            raise ValueError(f"--device {args.device}: a list names CUDA indices, such as 0,1")
        code = distributed.launch(devices, distributed.with_device(args.argv, "auto"))
        if code:
            raise RuntimeError(
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
    from train.bench import bench_train

    bench_train(args)


def _info(args: argparse.Namespace) -> None:
    from core.checkpoint import load_model

    model = load_model(args.model)
    if args.fuse:
        model = model.reparameterize().fuse()
    print(model.info(args.img))


def _convert(args: argparse.Namespace) -> None:
    from core.checkpoint import convert, read_checkpoint

    out = convert(args.src, args.out)
    ck = read_checkpoint(out)
    print(f"wrote {out} ({ck['cfg'].get('name')}, {len(ck['model'])} tensors, {len(ck['names'])} classes)")


def register(sub, bench) -> None:
    s = sub.add_parser(
        "info",
        help="print layers, parameters and GFLOPs of a model",
        description="Print the layer table, parameter count and GFLOPs of a model.",
    )
    s.add_argument("model", help="checkpoint (official or ours), model YAML, or zoo name such as yolov9-s")
    s.add_argument("--img", type=int, default=640, help="image size for the GFLOPs count (default 640)")
    s.add_argument("--fuse", action="store_true", help="show the deployed form (re-parameterized and fused)")
    s.set_defaults(func=_info)

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
        description="Train a YOLOv9/GELAN detector with AMP.",
    )
    _add_train_args(s)
    s.set_defaults(func=_train)

    s = bench.add_parser(
        "train",
        help="steady-state training throughput",
        description="Time training steps on real data (no synthetic input): images/s, GPU busy %, "
        "data-wait share, warm-up time, training FLOPs per image and model FLOP utilisation, and peak memory (as "
        "torch allocated and reserved it, and as nvidia-smi shows it), for each --amp mode. Under torchrun each "
        "rank runs the step under DDP and rank 0 reports the images/s of all ranks together.",
    )
    s.add_argument("--cfg", default="yolov9-s", help="model config")
    s.add_argument("--data", default=None, help="dataset (as for `yolov9 train`)")
    s.add_argument("--img", type=int, default=640, help="image size")
    s.add_argument("--batch", type=int, default=128, help="batch size per GPU (under torchrun, per rank)")
    s.add_argument("--amp", default="off,fp16,bf16", help="comma-separated AMP modes to measure")
    s.add_argument("--steps", type=int, default=30, help="timed steps per mode")
    s.add_argument("--warmup", type=int, default=10, help="untimed warm-up steps per mode")
    s.add_argument("--workers", type=int, default=8, help="loader worker processes")
    s.add_argument("--cache", default="ram", choices=["ram", "disk", "none"], help="image cache")
    s.add_argument("--device", default="auto", help="auto, cpu or cuda:N")
    s.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="channels-last memory format on the GPU (as the trainer)",
    )
    s.add_argument(
        "--cudnn-benchmark",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let cuDNN time its convolution algorithms (as the trainer)",
    )
    s.add_argument(
        "--profile",
        default=None,
        metavar="FILE",
        help="after timing, profile 3 steps: add operator calls and kernel launches per step to the results and "
        "append the top-operator table to FILE",
    )
    s.add_argument(
        "--cuda-graph",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="capture the step as CUDA graphs on one GPU, as `yolov9 train` does by default (--no-cuda-graph: eager)",
    )
    s.add_argument(
        "--peak-tflops",
        type=float,
        default=790.0,
        help="the GPU's dense fp16/bf16 rate, the denominator of the reported model FLOP utilisation (mfu); the "
        "default is the H200's",
    )
    s.add_argument("--out", default=None, help="write results as JSON here")
    s.set_defaults(func=_bench_train)
