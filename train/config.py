"""The training configuration as one tree: `TrainConfig` (every option of `yolov9 train`, help text in the fields)
with the hyper-parameters (`Hyp`) and the loss gains (`LossGains`) as sections. The command line is generated from
it (core/options.py); YAML goes in through `--hyp` (the official hyp.scratch-high.yaml layout: one flat mapping)
and out as `args.yaml` in the run folder, which `--resume` reads back. Torch-free, so `--help` is fast."""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

from yolov9.core.errors import BadInput
from yolov9.core.options import option, require_at_least
from yolov9.core.yaml_io import read_yaml


@dataclass
class Hyp:
    """Optimisation and augmentation hyper-parameters; defaults are the official hyp.scratch-high."""

    lr0: float = option(0.01, "initial learning rate")
    lrf: float = option(0.01, "final learning rate as a fraction of lr0")
    momentum: float = option(0.937, "SGD momentum (AdamW beta1)")
    weight_decay: float = option(0.0005, "weight decay at the nominal batch")
    warmup_epochs: float = option(3.0, "warm-up epochs (at least 100 steps)")
    warmup_momentum: float = option(0.8, "momentum at the start of the warm-up")
    warmup_bias_lr: float = option(0.1, "bias learning rate at the start of the warm-up")
    hsv_h: float = option(0.015, "hue jitter (fraction)")
    hsv_s: float = option(0.7, "saturation jitter (fraction)")
    hsv_v: float = option(0.4, "value jitter (fraction)")
    degrees: float = option(0.0, "rotation (+/- degrees)")
    translate: float = option(0.1, "translation (+/- fraction)")
    scale: float = option(0.9, "scale (+/- gain)")
    shear: float = option(0.0, "shear (+/- degrees)")
    perspective: float = option(0.0, "perspective (+/- fraction)")
    flipud: float = option(0.0, "up-down flip probability")
    fliplr: float = option(0.5, "left-right flip probability")
    mosaic: float = option(1.0, "mosaic probability")
    mixup: float = option(0.15, "mixup probability")


@dataclass
class LossGains:
    """Weights of the loss terms (the official hyp file's box, cls and dfl)."""

    box: float = option(7.5, "CIoU box loss gain")
    cls: float = option(0.5, "classification (BCE) loss gain")
    dfl: float = option(1.5, "distribution focal loss gain")


# keys of the official hyp files that mean nothing for this anchor-free, segment-free detector
IGNORED_HYP_KEYS = {
    "cls_pw": "BCE positive weight (the official loss builds it but does not use it)",
    "obj": "objectness gain (no objectness branch)",
    "obj_pw": "objectness positive weight (no objectness branch)",
    "iou_t": "IoU training threshold (anchor-based YOLO only)",
    "anchor_t": "anchor-multiple threshold (no anchors)",
    "fl_gamma": "focal loss gamma (the official YOLOv9 loss is BCE)",
    "copy_paste": "segment copy-paste (needs segment labels)",
    "label_smoothing": "label smoothing (not in the YOLOv9 loss)",
}

# what `yolov9 train` trains when --cfg, --img or --epochs are not given: a CPU run that ends in minutes (the
# quickstart's), and the official small model on a GPU
CPU_DEFAULTS = {"cfg": "gelan-t", "img": 320, "epochs": 3}
GPU_DEFAULTS = {"cfg": "yolov9-s", "img": 640, "epochs": 100}


@dataclass
class TrainConfig:
    """Every option of `yolov9 train`; the command line is generated from these fields."""

    data: str | None = option(
        None,
        "dataset: YOLO/COCO/VOC dataset YAML, COCO instances JSON, VOC or YOLO folder (its data.yaml when it has "
        "one), or a dataset name looked up in $YOLOV9_DATASETS, ../shared/datasets and ./datasets (default: "
        "coco128 there, else the shipped coco48; README 'Datasets' explains the YAML)",
    )
    cfg: str | None = option(
        None,
        "model config: zoo name (yolov9-t/s/m/c/e, gelan-t/s/m/c/e) or YAML path (default: yolov9-s on a GPU, "
        "gelan-t on a CPU)",
    )
    weights: str | None = option(
        None, "start from this checkpoint (official or ours); a different class count re-initialises class outputs"
    )
    img: int | None = option(None, "training and validation image size in pixels (default: 640 on a GPU, 320 on a CPU)")
    epochs: int | None = option(None, "number of epochs (default: 100 on a GPU, 3 on a CPU)")
    batch: int = option(
        16,
        "global batch size, split evenly across the ranks of a multi-GPU run (so LR, warm-up and accumulation stay "
        "those of one process with this batch); -1 picks the largest that fits each GPU",
    )
    nbs: int = option(64, "nominal batch size: gradients accumulate to about this many images per optimizer step")
    accumulate: int | None = option(None, "override the accumulation steps computed from --nbs")
    amp: Literal["auto", "bf16", "fp16", "off"] = option(
        "auto",
        "mixed precision: bf16, fp16 (with a gradient scaler) or off; auto is fp16 on a GPU (faster than bf16 on "
        "the GPUs measured), bf16 on a CPU with bf16 instructions (avx512_bf16/AMX) and off on other CPUs",
    )
    optimizer: Literal["SGD", "AdamW"] = option("SGD", "SGD (official recipe) or AdamW")
    cos_lr: bool = option(False, "cosine LR schedule instead of linear")
    clip: float = option(10.0, "gradient-norm clipping threshold")
    close_mosaic: int = option(15, "turn mosaic off for the last N epochs")
    cache: Literal["ram", "disk"] | None = option(None, "keep decoded, resized images in 'ram' or on 'disk'")
    workers: int | None = option(
        None, "data loader worker processes (default: 8, at most the CPU count; on --resume, the run's)"
    )
    device: str | None = option(
        None,
        "auto, cpu, a CUDA index such as 0, or a list such as 0,1 for one process per GPU (started through "
        "torchrun's launcher; under an external torchrun each rank takes cuda:LOCAL_RANK) (default: auto; on "
        "--resume, the run's)",
    )
    seed: int = option(0, "random seed (data order and augmentation are a function of seed, epoch and index)")
    project: str = option("runs/train", "folder of runs")
    name: str = option("exp", "run name (runs/train/NAME; a number is appended if it exists)")
    exist_ok: bool = option(False, "reuse the run folder if it exists")
    val: bool = option(True, "validate during training (--no-val to skip)")
    val_interval: int = option(1, "validate every N epochs (and always at the end)")
    stop_after: int | None = option(
        None, "stop after N epochs of this run while keeping the --epochs schedule (continue with --resume)"
    )
    resume: str | None = option(
        None,
        "continue a run exactly: its folder or its weights/last.pt; without a value, the newest run in --project",
        nargs="?",
        const="latest",
        metavar="RUN",
    )
    allow_empty: bool = option(
        False,
        "train even when a split has no boxes at all (background-only data); otherwise that is an error",
    )
    channels_last: bool = option(True, "channels-last memory format on the GPU")
    cudnn_benchmark: bool | None = option(
        None,
        "let cuDNN time its convolution algorithms for the fixed input size: steps 5-9%% faster (yolov9-s, batch "
        "32-128) for 5-9 s more before the first step; the chosen algorithms, and so the last bits of the results, "
        "may differ between runs. By default on for a run of at least 40,000 training images (epochs x images), "
        "where the faster steps earn the timing back, and off for a shorter one; --cudnn-benchmark or "
        "--no-cudnn-benchmark decides. Validation never times (its shapes would be timed afresh for no gain). "
        "Numbers: docs/benchmarks.md",
    )
    prewarm: bool = option(
        True,
        "on one GPU, run one training step of a copy of the model on a synthetic batch while a thread checks and "
        "caches the images and starts the loader's workers, so the first real step finds cuDNN's algorithm timing "
        "and kernel loading done (seconds per shape) and the first batches built; the run's model, statistics and "
        "random streams are untouched. Skipped with --batch -1 (its memory trials would see the copy's) and on "
        "several GPUs",
    )
    sync_bn: bool = option(False, "synchronise BatchNorm statistics across the GPUs of a multi-GPU run (SyncBatchNorm)")
    cuda_graph: bool = option(
        True,
        "on one GPU, capture each micro-batch's forward, loss and backward and the optimizer step (unscale, clip, "
        "SGD/AdamW, EMA) as CUDA graphs and replay them: one launch instead of thousands, faster at every batch "
        "size measured and most at small ones (docs/benchmarks.md); --no-cuda-graph trains eagerly. Warm-up steps "
        "run the optimizer eagerly (momentum ramps); a short last batch runs eagerly; a multi-GPU run stays eager "
        "(DDP's all-reduce hooks cannot be captured); ignored on the CPU",
    )
    compile: Literal["auto", "off", "loss", "layers", "model"] = option(
        "auto",
        "torch.compile (inductor), cached in ~/.cache/yolov9/inductor so that a machine compiles a model and batch "
        "once. 'loss': the loss and its assigner as one graph (eagerly thousands of small kernels per step) for any "
        "box count: on an H200 11-29%% more images/s, the first step after about a minute and a half the first time "
        "(compile, autotuning, capture), about half a minute from the cache. 'layers' (each layer its own region) and"
        " 'model' (one graph) compile the forward and backward too, with the loss unless --no-compile-loss: "
        "BatchNorm, SiLU and copies fused, a fifth to two fifths less GPU memory and about 1.4x the uncompiled "
        "images/s, but compiled before the first step four to five minutes the first time, 20 s from the cache. "
        "'auto' (default), on one GPU: 'layers' for a run of at least 300,000 training images (epochs x images), "
        "or of 40,000 when this machine compiled the same model and batch before (a record beside inductor's "
        "cache); with --no-compile-background 'layers' for 1,500,000 (or that 40,000) and 'loss' for 300,000; else "
        "'off', as a shorter run does not earn back the compile. 'off' on the CPU and under torchrun, where "
        "compiling was not measured to pay. Compiled for the first batch shape; a short last batch runs "
        "uncompiled; the compiled kernels run inside the CUDA graphs. Numbers: docs/benchmarks.md",
    )
    compile_loss: bool = option(
        True,
        "with --compile layers or model, also compile the loss and its assigner as one graph; --no-compile-loss "
        "compiles the model only",
    )
    compile_background: bool = option(
        True,
        "compile beside the run: the loss, and with --compile layers or model the forward too. The first steps "
        "train uncompiled (captured) and the compiled step takes over when ready. With inductor each part compiles "
        "first in a second process at a lower priority (its own CUDA context and GIL, at most the GPU memory free "
        "when it starts less 10%%), which fills inductor's cache; a thread on a copy of the model then compiles from "
        "that cache, at once when this machine compiled the same model and batch before (where the copy's forward "
        "and backward, one layer at a time in layers mode, would not fit in the free GPU memory, the training "
        "thread compiles at the takeover instead, for seconds). "
        "A failure in the second process leaves the part uncompiled, and a compile still running when the run ends "
        "stops with it. On an H100, gelan-s at batch 128: the first step at 32 s instead of about 4 minutes the "
        "first time, the run 0-8%% slower until the loss took over at 110 s and the layers at 370 s; from the "
        "cache, the first step at 27 s instead of 45-47 s and the compiled step from about 135 s. "
        "--no-compile-background compiles before the first step, as each rank of a multi-GPU run does "
        "(docs/benchmarks.md)",
    )
    hyp: Hyp = option(factory=Hyp, cli=False)
    loss: LossGains = option(factory=LossGains, cli=False)

    def __post_init__(self):
        """From Python, hyp may be a flat mapping in the hyp file's layout (loss gains included) and loss one too."""
        if self.loss is None:
            self.loss = LossGains()
        if isinstance(self.hyp, dict):
            values = self.hyp
            self.hyp, loss, _ = split_hyp(values, "TrainConfig(hyp=...)")
            if any(k in values for k in ("box", "cls", "dfl")):
                self.loss = loss
        if isinstance(self.loss, dict):
            self.loss = LossGains(**self.loss)
        self._check_counts()

    def _check_counts(self) -> None:
        """Counts that cannot train, refused before anything runs."""
        require_at_least(
            self, dict(epochs=1, nbs=1, accumulate=1, img=32, val_interval=1, stop_after=1, workers=0, close_mosaic=0)
        )
        if self.batch == 0 or self.batch < -1:
            raise BadInput(f"--batch {self.batch}: must be at least 1 (or -1: the largest that fits each GPU)")

    def resolved(self, cuda: bool) -> tuple[TrainConfig, list[str]]:
        """This config with the device-dependent defaults filled in, and the names it filled."""
        defaults = GPU_DEFAULTS if cuda else CPU_DEFAULTS
        filled = [k for k in defaults if getattr(self, k) is None]
        workers = min(8, os.cpu_count() or 1) if self.workers is None else self.workers
        cfg = dataclasses.replace(self, workers=workers, **{k: defaults[k] for k in filled})
        return cfg, filled

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """From `to_dict()` output (args.yaml, a checkpoint); older runs kept `hyp` as a flat mapping of overrides."""
        d = dict(d)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise BadInput(f"unknown training options {', '.join(unknown)} (known: {', '.join(sorted(names))})")
        return cls(**{**d, "hyp": {**(d.get("hyp") or {}), **(d.get("loss") or {})}, "loss": None})


def split_hyp(values: dict, source: str) -> tuple[Hyp, LossGains, list[str]]:
    """A flat hyper-parameter mapping (the official file's layout) -> (Hyp, LossGains, ignored keys). A key that is
    neither known nor one of the official file's ignored keys is refused, with the closest known key."""
    hyp_keys, loss_keys = {f.name for f in fields(Hyp)}, {f.name for f in fields(LossGains)}
    known = hyp_keys | loss_keys
    for k in values:
        if k not in known and k not in IGNORED_HYP_KEYS:
            close = difflib.get_close_matches(k, sorted(known), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise BadInput(f"{source}: unknown hyper-parameter '{k}'{hint} (known: {', '.join(sorted(known))})")
    for k, v in values.items():
        if k in known and not isinstance(v, (int, float)):
            raise BadInput(f"{source}: hyper-parameter '{k}' must be a number, got {v!r}")
    hyp = Hyp(**{k: float(v) for k, v in values.items() if k in hyp_keys})
    loss = LossGains(**{k: float(v) for k, v in values.items() if k in loss_keys})
    return hyp, loss, sorted(k for k in values if k in IGNORED_HYP_KEYS)


def load_hyp(path: str | Path) -> tuple[Hyp, LossGains, list[str]]:
    """A hyper-parameter YAML (e.g. the official hyp.scratch-high.yaml) -> (Hyp, LossGains, ignored keys)."""
    values = read_yaml(path)
    if not isinstance(values, dict):
        raise BadInput(f"{path}: a hyper-parameter file is a mapping of names to numbers")
    return split_hyp(values, str(path))


def ignored_note(keys: list[str]) -> str:
    return "note: ignored hyper-parameters with no meaning here: " + "; ".join(
        f"{k} ({IGNORED_HYP_KEYS[k]})" for k in keys
    )


@dataclass
class BenchTrainConfig:
    """`yolov9 bench train`: steady-state training steps through the real loader and step."""

    cfg: str = option("yolov9-s", "model config")
    data: str | None = option(None, "dataset (as for `yolov9 train`)")
    img: int = option(640, "image size")
    batch: int = option(128, "batch size per GPU (under torchrun, per rank)")
    amp: str = option("off,fp16,bf16", "comma-separated AMP modes to measure")
    steps: int = option(30, "timed steps per mode")
    warmup: int = option(10, "untimed warm-up steps per mode")
    workers: int = option(8, "loader worker processes")
    cache: Literal["ram", "disk", "none"] = option("ram", "image cache")
    device: str = option("auto", "auto, cpu or cuda:N")
    channels_last: bool = option(True, "channels-last memory format on the GPU (as the trainer)")
    cudnn_benchmark: bool = option(True, "let cuDNN time its convolution algorithms (as the trainer does in long runs)")
    profile: str | None = option(
        None,
        "after timing, profile 3 steps: add operator calls, kernel launches and GPU time per kind of kernel to the "
        "results, and append the top operators by host time and the top kernels by GPU time to FILE",
        metavar="FILE",
    )
    cuda_graph: bool = option(
        True, "capture the step as CUDA graphs on one GPU, as `yolov9 train` does by default (--no-cuda-graph: eager)"
    )
    compile: Literal["auto", "off", "loss", "layers", "model"] = option(
        "auto", "torch.compile mode, as `yolov9 train --compile` ('auto' here: as for a long run, 'layers' on one GPU)"
    )
    compile_loss: bool = option(True, "with --compile layers/model, compile the loss too, as `yolov9 train` does")
    peak_tflops: float = option(
        790.0,
        "the GPU's dense fp16/bf16 rate, the denominator of the reported model FLOP utilisation (mfu); the default "
        "is the H200's",
    )
    out: str | None = option(None, "write results as JSON here")

    def __post_init__(self):
        require_at_least(self, dict(img=32, batch=1, steps=1, warmup=0, workers=0))
