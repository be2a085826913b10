"""The export stage's command options as dataclasses (the command line is generated from them): `bench engine`.
Torch-free, so `--help` is fast."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

from yolov9.core.detection_defaults import CONF, IOU, require_thresholds
from yolov9.core.options import int_list, option, require_at_least


@dataclass
class BenchEngineConfig:
    """`yolov9 bench engine`: images/s and ms per batch of each engine, on random input."""

    weights: str = option(help="checkpoint or zoo name (engines are built from it)", positional=True)
    engines: str = option(
        "torch-fp32,torch-fp16,aoti-fp16,trt-fp16",
        "comma list of torch-fp32, torch-fp16, torch-fp16-graph, aoti-fp16, aoti-fp16-graph, trt-fp16, onnx-cpu "
        "(missing backends are reported and skipped)",
    )
    batches: list[int] = option(factory=lambda: [1, 8, 32, 64], help="comma list of batch sizes", type=int_list)
    img: int = option(640, "image size")
    iters: int = option(50, "timed iterations per point")
    warmup: int = option(10, "untimed iterations per point")
    workdir: str = option(tempfile.gettempdir(), "where built engines are written")
    out: str | None = option(None, "write the rows as JSON here")
    profile: str | None = option(
        None,
        "after timing each point on a GPU, profile 10 calls: add kernel launches and GPU time per kind of kernel "
        "(cuDNN's convolutions, Inductor's fused kernels, copies) to its row, and append the top kernels to FILE",
        metavar="FILE",
    )


VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".mpg", ".mpeg")


@dataclass
class PredictConfig:
    """`yolov9 predict`: detections as JSON lines, and (unless --no-save) annotated copies in a run folder."""

    weights: str = option(
        help="checkpoint, engine file (.onnx, .pt2, .plan) or zoo name (a zoo name is an untrained model)",
        positional=True,
    )
    source: list[str] = option(
        factory=list,
        help="image files, folders of images or video frames, or video files "
        f"({', '.join(VIDEO_SUFFIXES)}) (default: the shipped sample images)",
        positional=True,
        nargs="*",
        type=str,
    )
    engine: str | None = option(
        None, "engine file (.onnx, .pt2, .plan), or auto: the fastest engine exported beside WEIGHTS"
    )
    img: int | None = option(None, "inference size (default: the engine's, or the size a checkpoint trained at)")
    conf: float = option(CONF, "score threshold")
    iou: float = option(IOU, "NMS IoU threshold")
    max_det: int = option(300, "detections per image")
    classes: list[int] | None = option(None, "keep only these class ids", nargs="*", type=int)
    device: str = option("auto", "auto, cpu or cuda:N")
    project: str = option("runs", "folder of prediction runs")
    name: str = option("predict", "run name: PROJECT/NAME, numbered predict2, predict3, ... when it exists")
    exist_ok: bool = option(False, "reuse PROJECT/NAME when it exists")
    save: bool = option(True, "save annotated images (and videos)")
    save_txt: bool = option(False, "save YOLO labels per image in labels/ (class x y w h, normalised)")
    save_conf: bool = option(False, "with --save-txt: the score as a sixth column")
    save_crop: bool = option(False, "save each detection's crop in crops/<class>/")

    def __post_init__(self):
        require_thresholds(self.conf, self.iou, self.max_det, self.classes)
        require_at_least(self, dict(img=32))
