"""`yolov9 val`: mAP of weights, of any exported engine, of several engines side by side (--engines), or of a
running deployment (--url). Above the stages because --url scores the serving stack."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from yolov9.core.detection_defaults import require_thresholds
from yolov9.core.errors import BadInput, MissingInput, Unavailable
from yolov9.core.options import require_at_least

ENGINE_FILES = {"onnx": ".onnx", "aoti": ".pt2", "trt": ".plan"}  # --engines names exported beside the weights


def _protocol(args: argparse.Namespace):
    from yolov9.export.evaluate import Protocol

    return Protocol(not args.square, not args.single_label, args.conf, args.iou, args.max_det)


def _trained_on(weights: str | None) -> str | None:
    """The dataset a checkpoint or engine records (None: the default data), said in one line."""
    from yolov9.export.engine import weights_meta

    if not weights:
        return None
    data = weights_meta(weights.removeprefix("auto:")).data
    if data:
        print(f"data: {data} (the dataset {Path(weights).name} was trained on; --data overrides)")
    return data


def _mapped(engine, ds):
    """The engine as scored on `ds`: its classes matched to the data's by name when the lists differ (one note),
    refused when the data has classes the model lacks."""
    from yolov9.train.validate import ClassMapped, class_index

    index = class_index(engine.names, ds.names)
    if index is None:
        return engine
    print(
        f"note: the model's {len(engine.names)} classes and the data's {len(ds.names)} differ; matched by name "
        f"(detections of the model's other classes are left out)"
    )
    return ClassMapped(engine, index)


def _report(res: dict, out: str | None) -> None:
    from yolov9.train.validate import format_table

    print(format_table(res))
    print(f"{res['engine']}, {res['protocol']}: mAP50-95 {res['map']:.4f}  mAP50 {res['map50']:.4f}")
    if out:
        Path(out).write_text(json.dumps(res, indent=1))


def _val_one(args: argparse.Namespace) -> None:
    from yolov9.export.engine import engine_spec, load_engine
    from yolov9.export.evaluate import load_val_split, score_engine

    spec = engine_spec(args.engine, args.weights)
    engine = load_engine(spec, device=args.device, img_size=args.img, half=args.half)
    protocol = _protocol(args)
    if engine.kind != "torch" and (protocol.rect or protocol.multi_label):  # scored as it runs when served
        print(
            f"note: {engine.kind} engines are scored as served (fixed {engine.img_size} px square, one label per box)"
        )
        protocol = replace(protocol, rect=False, multi_label=False)
    ds = load_val_split(args.data or _trained_on(args.weights or spec), args.split, engine.img_size, protocol)
    print(ds.describe())
    res = score_engine(_mapped(engine, ds), ds, protocol, args.batch, args.workers)
    res["engine"] = f"engine {engine.kind} at {engine.img_size} px"
    _report(res, args.out)


def _val_url(args: argparse.Namespace) -> None:
    """The deployment at --url scored on the dataset's original files, as a client sends them."""
    from yolov9.export.evaluate import DEPLOYMENT, load_val_split
    from yolov9.serve.endpoint import detect_files, original_sizes
    from yolov9.train.validate import score

    # only the ground truth is used: the server letterboxes the files itself
    ds = load_val_split(args.data or _trained_on(args.weights), args.split, args.img or 640, DEPLOYMENT)
    print(ds.describe())
    per_image = detect_files(args.url, ds.images, args.conf, args.iou, args.max_det)
    dets = [[i, x1, y1, x2 - x1, y2 - y1, s, int(c)] for i, d in enumerate(per_image) for x1, y1, x2, y2, s, c in d]
    res, _ = score(ds, dict(enumerate(original_sizes(ds.images))), dets)
    res["engine"] = f"endpoint {args.url}"
    res["protocol"] = (
        f"the server's own pre- and post-processing (conf {args.conf:g}, IoU {args.iou:g}, at most {args.max_det})"
    )
    _report(res, args.out)


def _val_table(args: argparse.Namespace) -> None:
    """Several engines of the same weights on the same data: mAP and images/s in the deployment protocol, and
    PyTorch fp32 in the official one."""
    import torch

    from yolov9.export.engine import load_engine
    from yolov9.export.evaluate import load_val_split, score_engine

    if not args.weights:
        raise BadInput("--engines needs WEIGHTS (the engines are looked up beside them)")
    deploy, data = replace(_protocol(args), rect=False, multi_label=False), args.data or _trained_on(args.weights)
    rows, datasets = [], {}
    for name in [n.strip() for n in args.engines.split(",") if n.strip()] + ["torch-fp32-official"]:
        protocol = _protocol(args) if name.endswith("official") else deploy
        try:
            engine = _open(name, args, load_engine, torch.cuda.is_available())
        except (FileNotFoundError, RuntimeError, ValueError) as e:
            print(f"{name}: skipped ({str(e).splitlines()[0]})")
            continue
        key = (engine.img_size, protocol.rect)
        if key not in datasets:
            datasets[key] = load_val_split(data, args.split, engine.img_size, protocol)
        res = score_engine(_mapped(engine, datasets[key]), datasets[key], protocol, args.batch, args.workers)
        rows.append({"engine": name, "img": engine.img_size, **{k: res[k] for k in ("map", "map50", "images_per_s")}})
        rows[-1]["protocol"] = "official" if protocol.rect else "deployment"
    print(f"{'engine':<22}{'protocol':<12}{'img':>5}{'mAP50-95':>10}{'mAP50':>8}{'images/s':>10}")
    for r in rows:
        print(
            f"{r['engine']:<22}{r['protocol']:<12}{r['img']:>5}{r['map']:>10.4f}{r['map50']:>8.4f}{r['images_per_s']:>10.1f}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


def _open(name: str, args: argparse.Namespace, load_engine, cuda: bool):
    if name.startswith("torch"):
        half = "fp16" in name
        if half and not cuda:
            raise Unavailable("fp16 PyTorch needs a CUDA GPU")
        return load_engine(args.weights, device=args.device, half=half, img_size=args.img)
    kind = name.split("-")[0]
    if kind not in ENGINE_FILES:
        raise BadInput(f"unknown engine {name}: choose torch-fp32, torch-fp16, {', '.join(ENGINE_FILES)}")
    path = Path(args.weights).with_suffix(ENGINE_FILES[kind])
    if not path.exists():
        raise MissingInput(f"no {path.name} beside the weights: yolov9 export {kind} {args.weights}")
    return load_engine(path, device=args.device)


def val(args: argparse.Namespace) -> None:
    require_at_least(args, dict(img=32, batch=1, workers=0))
    require_thresholds(args.conf, args.iou, args.max_det)
    if args.url:
        return _val_url(args)
    if args.engines:
        return _val_table(args)
    return _val_one(args)


def register(sub) -> None:
    s = sub.add_parser(
        "val",
        help="COCO mAP of weights, an engine, several engines, or a running deployment",
        description="Validate with pycocotools: mAP50-95, mAP50 and a per-class table. PyTorch weights are scored "
        "in the official protocol (the paper's table: rectangular batches, multi-label NMS, conf 0.001, IoU 0.7, "
        "at most 300); exported engines, --engines and --url in the deployment one (what predict and the server "
        "do). The output names the protocol of each number.",
    )
    s.add_argument("weights", nargs="?", default=None, help="checkpoint, zoo name, or engine file")
    s.add_argument(
        "--engine", default=None, help="engine file (.onnx, .pt2, .plan), or auto: the fastest exported beside WEIGHTS"
    )
    s.add_argument(
        "--engines",
        default=None,
        metavar="LIST",
        help="comma list of torch-fp32, torch-fp16, onnx, aoti, trt (those found beside WEIGHTS): one table of "
        "mAP and images/s in the deployment protocol, plus PyTorch fp32 in the official one",
    )
    s.add_argument(
        "--url",
        default=None,
        help="score a running deployment instead: a gateway (http://HOST:PORT) or Triton gRPC (HOST:PORT), sent "
        "the dataset's original image files",
    )
    s.add_argument(
        "--data",
        default=None,
        help="dataset, as for `yolov9 train` (default: the one the weights were trained on, else the default data)",
    )
    s.add_argument("--split", default="val", choices=["train", "val"], help="dataset split")
    s.add_argument("--img", type=int, default=None, help="image size (default: the engine's or checkpoint's)")
    s.add_argument("--square", action="store_true", help="square letterbox of the original image (deployment)")
    s.add_argument("--single-label", action="store_true", help="one label per box, the best class (deployment)")
    s.add_argument("--batch", type=int, default=32, help="batch size")
    s.add_argument("--workers", type=int, default=4, help="loader worker processes")
    s.add_argument("--device", default="auto", help="auto, cpu or cuda:N")
    s.add_argument(
        "--half",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="PyTorch weights: fp16 (default on CUDA) or fp32 (--no-half)",
    )
    s.add_argument("--conf", type=float, default=0.001, help="score threshold before NMS")
    s.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold")
    s.add_argument("--max-det", type=int, default=300, help="detections kept per image")
    s.add_argument("--out", default=None, help="write the metrics as JSON here")
    s.set_defaults(func=val)
