"""Subcommands of the export stage: `export onnx|aoti|trt`, `predict` (any engine) and `bench engine`."""

from __future__ import annotations

import argparse
from pathlib import Path

from yolov9.core.detection_defaults import CONF, IOU, MAX_DET, Thresholds, require_thresholds
from yolov9.core.errors import BadInput
from yolov9.core.options import add_options, from_namespace, require_at_least
from yolov9.core.paths import SAMPLE_IMAGES as SAMPLES
from yolov9.export.config import BenchEngineConfig, PredictConfig


def _inductor_configs(pairs: list[str]) -> dict:
    import ast

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise BadInput(f"--inductor expects KEY=VALUE, got '{pair}'")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value  # a bare string
    return out


def _nms(args: argparse.Namespace) -> Thresholds | None:
    """--end2end's thresholds (None: no NMS in the graph)."""
    return Thresholds(args.conf, args.iou, args.max_det) if args.end2end else None


def _default_out(weights: str, suffix: str) -> Path:
    """Beside the weights (where `--engine auto` looks), or in the working folder for a zoo name."""
    p = Path(weights)
    return p.with_suffix(suffix) if p.is_file() else Path(p.name).with_suffix(suffix)


def _export(args: argparse.Namespace) -> None:
    from yolov9.export.engine import weights_meta

    require_at_least(args, dict(img=32, min_batch=1, opt_batch=1, max_batch=1))
    if args.end2end:
        require_thresholds(args.conf, args.iou, args.max_det)

    img = args.img or weights_meta(args.weights).img_size
    if args.format == "onnx":
        from yolov9.export.onnx_export import export_onnx

        out = export_onnx(
            args.weights,
            args.out or _default_out(args.weights, ".onnx"),
            img=img,
            half=args.half,
            dynamic_hw=args.dynamic_hw,
            nms=_nms(args),
        )
        _check_onnx(args.weights, out, img) if not args.end2end else None
    elif args.format == "aoti":
        from yolov9.export.aoti import export_aoti

        out = export_aoti(
            args.weights,
            args.out or _default_out(args.weights, ".pt2"),
            img=img,
            half=not args.fp32,
            device=args.device,
            max_batch=args.max_batch,
            inductor_configs=_inductor_configs(args.inductor),
        )
    else:
        out = _export_trt(args, img)
    print(f"wrote {out}")
    if args.data and not args.end2end:
        _map_delta(args.weights, out, args.data)


def _map_delta(weights: str, engine_path: Path, data: str) -> None:
    """The exported engine's mAP against PyTorch fp32 on the same device, both in the deployment protocol."""
    from yolov9.export.engine import load_engine
    from yolov9.export.evaluate import DEPLOYMENT, load_val_split, score_engine

    engine = load_engine(engine_path)
    ref = load_engine(weights, device=str(engine.device), half=False, img_size=engine.img_size)
    ds = load_val_split(data, "val", engine.img_size, DEPLOYMENT)
    got, want = (score_engine(e, ds, DEPLOYMENT, workers=0) for e in (engine, ref))
    print(
        f"mAP50-95 on {data}: {engine.kind} {got['map']:.4f}, PyTorch fp32 {want['map']:.4f} "
        f"(delta {got['map'] - want['map']:+.4f}; mAP50 delta {got['map50'] - want['map50']:+.4f})"
    )


def _export_trt(args: argparse.Namespace, img: int) -> Path:
    from yolov9.export.tensorrt import BuildProfile, build_engine, import_tensorrt, needs_fp16_onnx

    import_tensorrt()  # fail in one line, before any work, when TensorRT is missing
    src = Path(args.weights)
    out = Path(args.out or _default_out(args.weights, ".plan"))
    if src.suffix != ".onnx":
        from yolov9.export.onnx_export import export_onnx

        src = export_onnx(
            args.weights,
            out.with_suffix(".onnx"),
            img=img,
            half=needs_fp16_onnx(),
            nms=_nms(args),
        )
    profile = BuildProfile(args.min_batch, args.opt_batch, args.max_batch, args.workspace, args.timing_cache)
    build_engine(src, out, profile, fp16=True)
    if not args.end2end:
        _compare_engines(out, src, img)
    return out


def _sample_batch(img: int):
    from yolov9.core.decode import decode_image
    from yolov9.core.preprocess import prepare_batch, to_input

    images = [decode_image(p) for p in sorted(SAMPLES.glob("*.jpg"))]
    batch, _ = prepare_batch(images, img)
    return to_input(batch)


def _check_onnx(weights: str, onnx_path: Path, img: int) -> None:
    """ONNX Runtime against PyTorch on the shipped sample images."""
    from yolov9.core.checkpoint import load_model
    from yolov9.export.onnx_export import OnnxEngine
    from yolov9.export.torch_engine import TorchEngine

    x = _sample_batch(img)
    ref = TorchEngine(load_model(weights), "cpu")(x)
    got = OnnxEngine(onnx_path)(x)
    rel = float((got - ref).norm() / ref.norm())
    print(f"ONNX Runtime vs PyTorch on {len(x)} sample images: relative L2 error {rel:.2e}")


def _compare_engines(plan: Path, onnx_path: Path, img: int) -> None:
    from yolov9.export.onnx_export import OnnxEngine
    from yolov9.export.tensorrt import TensorRTEngine

    x = _sample_batch(img)
    ref = OnnxEngine(onnx_path)(x)
    got = TensorRTEngine(plan)(x).cpu()
    boxes = (got[:, :4] - ref[:, :4]).abs().max().item()
    scores = (got[:, 4:] - ref[:, 4:]).abs().max().item()
    print(
        f"TensorRT vs ONNX Runtime on {len(x)} sample images: max |box diff| {boxes:.3f} px, "
        f"max |score diff| {scores:.2e}"
    )


def _predict(args: argparse.Namespace) -> None:
    from yolov9.export.predict import run_predict

    run_predict(from_namespace(PredictConfig, args))


def _info(args: argparse.Namespace) -> None:
    """A model's layers, parameters and GFLOPs, with what a checkpoint records of its training; an exported
    engine's metadata."""
    from yolov9.core.checkpoint import load_model, read_checkpoint
    from yolov9.export.engine import ENGINE_SUFFIXES, weights_meta

    path = Path(args.model)
    if path.suffix in ENGINE_SUFFIXES:
        meta = weights_meta(path)
        print(f"{path}: {path.suffix[1:]} engine, {meta.img_size} px input ({meta.dtype}), {len(meta.names)} classes")
        nms = f"NMS inside (conf {meta.nms['conf']}, IoU {meta.nms['iou']}, {meta.nms['max_det']} max)"
        print(f"  outputs   {nms if meta.end2end else 'raw predictions (B, 4 + classes, anchors)'}")
        print(f"  built for {meta.device}; exported from {meta.source or '?'}; trained on {meta.data or '?'}")
        print(f"  classes   {', '.join(meta.names[:10])}{' ...' if len(meta.names) > 10 else ''}")
        return
    model = load_model(args.model)
    if args.fuse:
        model = model.reparameterize().fuse()
    print(model.info(args.img))
    if path.is_file():
        ck = read_checkpoint(path)
        meta, train = ck.get("meta") or {}, ck.get("train")
        done = f"epoch {meta['epoch'] + 1}" + (f" of {meta['epochs']}" if meta.get("epochs") else "")
        score = f"mAP50-95 {meta['map']:.4f}, mAP50 {meta['map50']:.4f}" if meta.get("map") is not None else "no mAP"
        if "epoch" in meta:
            print(f"trained: {done}, {score}, data {meta.get('data', '?')}, {meta.get('img_size', '?')} px")
        print("training state: " + ("resumable (--resume)" if train else "none (final or converted weights)"))


def _bench_engine(args: argparse.Namespace) -> None:
    from yolov9.export.bench import bench_engines

    bench_engines(from_namespace(BenchEngineConfig, args))


def register(sub, bench) -> None:
    s = sub.add_parser(
        "info",
        help="a model's layers, parameters and GFLOPs, or an exported engine's metadata",
        description="Print the layer table, parameter count and GFLOPs of a model (and what a checkpoint records of "
        "its training: epochs, data, mAP), or the metadata of an exported .onnx, .pt2 or .plan.",
    )
    s.add_argument("model", help="checkpoint (official or ours), model YAML, zoo name, or engine file")
    s.add_argument("--img", type=int, default=640, help="image size for the GFLOPs count")
    s.add_argument("--fuse", action="store_true", help="show the deployed form (re-parameterized and fused)")
    s.set_defaults(func=_info)

    s = sub.add_parser(
        "export",
        help="export weights to ONNX, AOTInductor (.pt2) or TensorRT (.plan)",
        description="Re-parameterize (YOLOv9 -> GELAN), fuse and export. The engine and its metadata file "
        "(class names, image size) land beside the weights, where `--engine auto` finds them.",
    )
    s.add_argument("format", choices=["onnx", "aoti", "trt"], help="onnx, aoti (AOTInductor .pt2) or trt (TensorRT)")
    s.add_argument("weights", help="checkpoint (official or ours) or zoo name; for trt also an .onnx file")
    s.add_argument(
        "-o", "--out", default=None, help="output file (default: beside the weights, with the format's suffix)"
    )
    s.add_argument("--img", type=int, default=None, help="input image size (default: the size the weights trained at)")
    s.add_argument("--half", action="store_true", help="onnx: export in fp16")
    s.add_argument("--fp32", action="store_true", help="aoti: compile in fp32 instead of fp16")
    s.add_argument("--dynamic-hw", action="store_true", help="onnx: dynamic height and width too")
    s.add_argument("--end2end", action="store_true", help="onnx/trt: NMS inside the graph, fixed-size outputs")
    s.add_argument("--conf", type=float, default=CONF, help="end2end: score threshold")
    s.add_argument("--iou", type=float, default=IOU, help="end2end: NMS IoU threshold")
    s.add_argument("--max-det", type=int, default=MAX_DET, help="end2end: detections per image")
    s.add_argument("--device", default="cuda", help="aoti: device to compile for (cuda or cpu)")
    s.add_argument(
        "--data", default=None, help="after exporting, print the engine's mAP delta against PyTorch on this dataset"
    )
    s.add_argument(
        "--inductor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="aoti: an Inductor config option for this compile (repeatable), e.g. max_autotune=True; values are "
        "Python literals (else strings). CUDA packages default to freezing=True and force_layout_optimization=True",
    )
    s.add_argument("--min-batch", type=int, default=1, help="trt: smallest batch of the optimization profile")
    s.add_argument("--opt-batch", type=int, default=16, help="trt: batch the profile is tuned for")
    s.add_argument("--max-batch", type=int, default=64, help="trt/aoti: largest batch")
    s.add_argument("--workspace", type=float, default=4.0, help="trt: builder workspace limit in GiB")
    s.add_argument("--timing-cache", default="trt_timing.cache", help="trt: persistent timing cache file")
    s.set_defaults(func=_export)

    s = sub.add_parser(
        "predict",
        help="detect objects in images and save annotated copies",
        description="Run a model or engine on images, folders and videos; prints one JSON line per image or frame "
        "and writes annotated copies (and with --save-txt / --save-crop labels and crops) to a numbered run folder.",
    )
    add_options(s, PredictConfig)
    s.set_defaults(func=_predict)

    s = bench.add_parser(
        "engine",
        help="inference throughput and latency of engines",
        description="images/s and ms per batch for each engine and batch size (random input).",
    )
    add_options(s, BenchEngineConfig)
    s.set_defaults(func=_bench_engine)
