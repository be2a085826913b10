"""Fill a Triton model repository for an engine.

`<name>`: python-backend model (serve/triton/model.py) that takes encoded image bytes as a UINT8 tensor and
returns fixed-size detections in original-image pixels; dynamic batching, warm-up, GPU or CPU instances.
With `trt_variant`, also the NGC form for Triton's TensorRT backend: `<name>_pre` (python: decode + letterbox)
-> `<name>_plan` (platform tensorrt_plan) -> `<name>_post` (python: NMS + scaling back), tied together by the
ensemble `<name>_trt` with the same inputs and outputs as `<name>`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from core.paths import sample_images
from export.engine import weights_meta
from export.metadata import EngineMeta

TEMPLATE_DIR = Path(__file__).parent / "triton"

_IO = """
input [
  { name: "IMAGE" data_type: TYPE_UINT8 dims: [ -1 ] allow_ragged_batch: true },
  { name: "CONF" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "IOU" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "MAX_DET" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "CLASSES" data_type: TYPE_INT32 dims: [ -1 ] optional: true allow_ragged_batch: true }
]
output [
  { name: "DETECTIONS" data_type: TYPE_FP32 dims: [ {max_det}, 6 ] },
  { name: "NUM_DETS" data_type: TYPE_INT32 dims: [ 1 ] }
]"""


def _batching(preferred: list[int], queue_delay_us: int, max_queue: int) -> str:
    # without preferred sizes Triton sends whatever is queued (up to max_batch) once an instance is free
    sizes = f"  preferred_batch_size: [ {', '.join(map(str, preferred))} ]\n" if preferred else ""
    return (
        f"dynamic_batching {{\n{sizes}"
        f"  max_queue_delay_microseconds: {queue_delay_us}\n"
        f"  default_queue_policy {{ max_queue_size: {max_queue} }}\n}}"
    )


def _params(d: dict) -> str:
    return "\n".join(
        f'parameters {{ key: "{k}" value: {{ string_value: {json.dumps(str(v), ensure_ascii=False)} }} }}'
        for k, v in d.items()
    )


def _warmup(name: str, sample: Path) -> str:
    return (
        f'model_warmup [{{ name: "{name}" batch_size: 1 inputs {{ key: "IMAGE" value: '
        f'{{ data_type: TYPE_UINT8 dims: [ {sample.stat().st_size} ] input_data_file: "{sample.name}" }} }} }}]'
    )


def build_repo(
    engine: str | Path,
    repo: str | Path = "model_repository",
    name: str = "yolov9",
    max_batch: int = 32,
    preferred: list[int] | None = None,
    queue_delay_us: int = 500,
    instances: int = 1,
    kind: str = "auto",
    max_det: int = 100,
    img_size: int | None = None,
    max_queue: int = 1024,
    trt_variant: bool = False,
    copy_engine: bool = True,
    cuda_graphs: bool = True,
) -> Path:
    """Write `repo/name` (and the TensorRT-backend variant if asked); returns the model folder."""
    if not 100 <= queue_delay_us <= 2000:
        raise ValueError("--queue-delay-us should be 100-2000 (0.1-2 ms): longer adds latency, shorter loses batching")
    if preferred is None:
        preferred = [b for b in (4, 8, 16, 32, 64) if b <= max_batch]
    if any(not 1 <= b <= max_batch for b in preferred):
        raise ValueError(f"--preferred-batch sizes must lie in 1..{max_batch} (the max batch)")
    engine = Path(engine)
    if not engine.exists() and engine.suffix:
        raise FileNotFoundError(f"{engine}: no such engine file")
    repo = Path(repo)
    model_dir = repo / name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    version = model_dir / "1"
    version.mkdir(parents=True)
    shutil.copy(TEMPLATE_DIR / "model.py", version / "model.py")
    if engine.exists() and copy_engine:
        shutil.copy(engine, version / engine.name)
        if EngineMeta.path_for(engine).exists():
            shutil.copy(EngineMeta.path_for(engine), version / EngineMeta.path_for(engine).name)
        engine_ref = engine.name
    else:  # a zoo name or a path used in place
        engine_ref = str(engine.resolve()) if engine.exists() else str(engine)
    if kind == "auto":
        import torch

        kind = "gpu" if torch.cuda.is_available() else "cpu"
    meta = weights_meta(engine)  # the engine's own size and classes (a checkpoint's training size)
    img_size = img_size or meta.img_size
    sample = next(iter(sample_images()), None)
    warm = ""
    if sample is not None:
        (model_dir / "warmup").mkdir()
        shutil.copy(sample, model_dir / "warmup" / sample.name)
        warm = _warmup("sample", model_dir / "warmup" / sample.name)
    config = "\n".join(
        [
            f'name: "{name}"',
            'backend: "python"',
            f"max_batch_size: {max_batch}",
            _IO.replace("{max_det}", str(max_det)),
            _batching(preferred, queue_delay_us, max_queue),
            f"instance_group [ {{ count: {instances} kind: {'KIND_GPU' if kind == 'gpu' else 'KIND_CPU'} }} ]",
            _params(
                {
                    "engine": engine_ref,
                    "max_det": max_det,
                    "img_size": img_size,
                    "names": json.dumps(meta.names),
                    "cuda_graphs": int(cuda_graphs),
                }
            ),
            warm,
            "",
        ]
    )
    (model_dir / "config.pbtxt").write_text(config)
    if trt_variant:
        _write_trt_variant(
            repo, name, engine, max_batch, preferred, queue_delay_us, instances, max_det, img_size, max_queue, kind
        )
    return model_dir


def _write_trt_variant(
    repo: Path,
    name: str,
    engine: Path,
    max_batch: int,
    preferred: list[int],
    queue_delay_us: int,
    instances: int,
    max_det: int,
    img_size: int,
    max_queue: int,
    kind: str = "gpu",
) -> None:
    """Pre/post-processing stay in python models around the tensorrt_plan model, so the ensemble keeps the API.
    The plan always runs on the GPU; `kind` places the python stages (cpu lets them be tested without one)."""
    stage_kind = "KIND_GPU" if kind == "gpu" else "KIND_CPU"
    plan_dir = repo / f"{name}_plan" / "1"
    plan_dir.mkdir(parents=True, exist_ok=True)
    if engine.suffix == ".plan" and engine.exists():
        shutil.copy(engine, plan_dir / "model.plan")
    (plan_dir.parent / "config.pbtxt").write_text(
        "\n".join(
            [
                f'name: "{name}_plan"',
                'platform: "tensorrt_plan"',
                f"max_batch_size: {max_batch}",
                f'input [ {{ name: "images" data_type: TYPE_FP16 dims: [ 3, {img_size}, {img_size} ] }} ]',
                'output [ { name: "output0" data_type: TYPE_FP16 dims: [ -1, -1 ] } ]',
                _batching(preferred, queue_delay_us, max_queue),
                f"instance_group [ {{ count: {instances} kind: KIND_GPU }} ]",
                "",
            ]
        )
    )
    for stage in ("pre", "post"):
        d = repo / f"{name}_{stage}" / "1"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(TEMPLATE_DIR / f"{stage}.py", d / "model.py")
    (repo / f"{name}_pre" / "config.pbtxt").write_text(
        "\n".join(
            [
                f'name: "{name}_pre"',
                'backend: "python"',
                f"max_batch_size: {max_batch}",
                'input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ -1 ] allow_ragged_batch: true } ]',
                f'output [ {{ name: "images" data_type: TYPE_FP16 dims: [ 3, {img_size}, {img_size} ] }},',
                '         { name: "META" data_type: TYPE_FP32 dims: [ 5 ] } ]',
                _batching(preferred, queue_delay_us, max_queue),
                f"instance_group [ {{ count: 1 kind: {stage_kind} }} ]",
                _params({"img_size": img_size}),
                "",
            ]
        )
    )
    (repo / f"{name}_post" / "config.pbtxt").write_text(
        "\n".join(
            [
                f'name: "{name}_post"',
                'backend: "python"',
                f"max_batch_size: {max_batch}",
                'input [ { name: "output0" data_type: TYPE_FP16 dims: [ -1, -1 ] },',
                '        { name: "META" data_type: TYPE_FP32 dims: [ 5 ] } ]',
                f'output [ {{ name: "DETECTIONS" data_type: TYPE_FP32 dims: [ {max_det}, 6 ] }},',
                '         { name: "NUM_DETS" data_type: TYPE_INT32 dims: [ 1 ] } ]',
                f"instance_group [ {{ count: 1 kind: {stage_kind} }} ]",
                _params({"max_det": max_det, "conf": 0.25, "iou": 0.45}),
                "",
            ]
        )
    )
    steps = [
        ("_pre", {"IMAGE": "IMAGE"}, {"images": "images", "META": "meta"}),
        ("_plan", {"images": "images"}, {"output0": "raw"}),
        ("_post", {"output0": "raw", "META": "meta"}, {"DETECTIONS": "DETECTIONS", "NUM_DETS": "NUM_DETS"}),
    ]
    body = []
    for suffix, inp, out in steps:
        maps = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inp.items())
        maps += " " + " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in out.items())
        body.append(f'    {{ model_name: "{name}{suffix}" model_version: -1 {maps} }}')
    ens = repo / f"{name}_trt"
    (ens / "1").mkdir(parents=True, exist_ok=True)
    (ens / "config.pbtxt").write_text(
        "\n".join(
            [
                f'name: "{name}_trt"',
                'platform: "ensemble"',
                f"max_batch_size: {max_batch}",
                'input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ -1 ] } ]',
                f'output [ {{ name: "DETECTIONS" data_type: TYPE_FP32 dims: [ {max_det}, 6 ] }},',
                '         { name: "NUM_DETS" data_type: TYPE_INT32 dims: [ 1 ] } ]',
                "ensemble_scheduling {\n  step [\n" + ",\n".join(body) + "\n  ]\n}",
                "",
            ]
        )
    )
