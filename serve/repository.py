"""Fill a Triton model repository for an engine.

`<name>`: python-backend model (serve/triton/model.py) that takes encoded image bytes as a UINT8 tensor and
returns fixed-size detections in original-image pixels; dynamic batching, warm-up, GPU or CPU instances.
With `trt_variant`, also the NGC form for Triton's TensorRT backend: `<name>_pre` (python: decode + letterbox)
-> `<name>_plan` (platform tensorrt_plan) -> `<name>_post` (python: NMS + scaling back), tied together by the
ensemble `<name>_trt` with the same inputs and outputs as `<name>`."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from yolov9.core.detection_defaults import CONF, IOU
from yolov9.core.errors import BadInput, MissingInput
from yolov9.core.model import zoo_names
from yolov9.core.paths import sample_images
from yolov9.export.engine import weights_meta
from yolov9.export.metadata import EngineMeta
from yolov9.serve.config import RepoConfig

TEMPLATE_DIR = Path(__file__).parent / "triton"


def install_model(template: str, version: Path) -> None:
    """A python-backend model file into a model version folder, with the module it imports first (caller_path)."""
    shutil.copy(TEMPLATE_DIR / template, version / "model.py")
    shutil.copy(TEMPLATE_DIR / "caller_path.py", version / "caller_path.py")


def _tensor(name: str, dtype: int, dims: list[int], **kw) -> dict:
    return {"name": name, "data_type": dtype, "dims": dims, **kw}


def _detect_io(config: mc.ModelConfig, max_det: int) -> None:
    """The python-backend model's inputs (encoded image bytes and optional per-request parameters) and outputs."""
    config.input.extend(
        [
            mc.ModelInput(**_tensor("IMAGE", mc.TYPE_UINT8, [-1], allow_ragged_batch=True)),
            mc.ModelInput(**_tensor("CONF", mc.TYPE_FP32, [1], optional=True)),
            mc.ModelInput(**_tensor("IOU", mc.TYPE_FP32, [1], optional=True)),
            mc.ModelInput(**_tensor("MAX_DET", mc.TYPE_INT32, [1], optional=True)),
            mc.ModelInput(**_tensor("CLASSES", mc.TYPE_INT32, [-1], optional=True, allow_ragged_batch=True)),
        ]
    )
    _outputs(config, max_det)


def _outputs(config: mc.ModelConfig, max_det: int) -> None:
    config.output.extend(
        [
            mc.ModelOutput(**_tensor("DETECTIONS", mc.TYPE_FP32, [max_det, 6])),
            mc.ModelOutput(**_tensor("NUM_DETS", mc.TYPE_INT32, [1])),
        ]
    )


def _batching(config: mc.ModelConfig, preferred: list[int], queue_delay_us: int, max_queue: int) -> None:
    # without preferred sizes Triton sends whatever is queued (up to max_batch) once an instance is free
    config.dynamic_batching.preferred_batch_size.extend(preferred)
    config.dynamic_batching.max_queue_delay_microseconds = queue_delay_us
    config.dynamic_batching.default_queue_policy.max_queue_size = max_queue


def _params(config: mc.ModelConfig, d: dict) -> None:
    for k, v in d.items():
        config.parameters[k].string_value = str(v)


def _instances(config: mc.ModelConfig, count: int, kind: str) -> None:
    gpu = mc.ModelInstanceGroup.KIND_GPU if kind == "gpu" else mc.ModelInstanceGroup.KIND_CPU
    config.instance_group.add(count=count, kind=gpu)


def _warmup(config: mc.ModelConfig, sample: Path) -> None:
    w = config.model_warmup.add(name="sample", batch_size=1)
    w.inputs["IMAGE"].data_type = mc.TYPE_UINT8
    w.inputs["IMAGE"].dims.append(sample.stat().st_size)
    w.inputs["IMAGE"].input_data_file = sample.name


def write_config(folder: Path, config: mc.ModelConfig) -> Path:
    out = folder / "config.pbtxt"
    out.write_text(text_format.MessageToString(config))
    return out


def read_config(folder: Path) -> mc.ModelConfig:
    return text_format.Parse((folder / "config.pbtxt").read_text(), mc.ModelConfig())


def build_repo(engine: str | Path, repo: str | Path = "model_repository", cfg: RepoConfig = RepoConfig()) -> Path:
    """Write `repo/<cfg.name>` (and the TensorRT-backend variant if asked); returns the model folder."""
    if not 0 <= cfg.queue_delay_us <= 2000:
        raise BadInput("--queue-delay-us should be 0-2000 (at most 2 ms): every request may wait that long")
    preferred = cfg.preferred_batch
    if preferred is None:
        preferred = [b for b in (4, 8, 16, 32, 64) if b <= cfg.max_batch]
    if any(not 1 <= b <= cfg.max_batch for b in preferred):
        raise BadInput(f"--preferred-batch sizes must lie in 1..{cfg.max_batch} (the max batch)")
    engine = Path(engine)
    if not engine.exists() and engine.suffix:
        raise MissingInput(f"{engine}: no such engine file")
    repo = Path(repo)
    model_dir = repo / cfg.name
    # this engine becomes version 1: earlier versions and their state go (serve/deploy.py)
    for old in [model_dir, *repo.glob(f"{cfg.name}__v*")] if repo.is_dir() else []:
        shutil.rmtree(old) if old.is_dir() else None
    (repo / f"{cfg.name}.versions.json").unlink(missing_ok=True)
    if not engine.exists() and str(engine) in zoo_names():
        print(f"note: {engine} is a model config: the repository serves an untrained model with random weights")
    version = model_dir / "1"
    version.mkdir(parents=True)
    install_model("model.py", version)
    if engine.exists() and cfg.copy_engine:
        shutil.copy(engine, version / engine.name)
        if EngineMeta.path_for(engine).exists():
            shutil.copy(EngineMeta.path_for(engine), version / EngineMeta.path_for(engine).name)
        engine_ref = engine.name
    else:  # a zoo name or a path used in place
        engine_ref = str(engine.resolve()) if engine.exists() else str(engine)
    kind = cfg.kind
    if kind == "auto":
        import torch

        kind = "gpu" if torch.cuda.is_available() else "cpu"
    meta = weights_meta(engine)  # the engine's own size and classes (a checkpoint's training size)
    img_size = cfg.img or meta.img_size
    config = mc.ModelConfig(name=cfg.name, backend="python", max_batch_size=cfg.max_batch)
    _detect_io(config, cfg.max_det)
    _batching(config, preferred, cfg.queue_delay_us, cfg.max_queue)
    _instances(config, cfg.instances, kind)
    params = {"engine": engine_ref, "max_det": cfg.max_det, "img_size": img_size, "names": json.dumps(meta.names)}
    _params(config, {**params, "cuda_graphs": int(cfg.cuda_graphs), "decoder": cfg.decoder, "gpu_wait": cfg.gpu_wait})
    sample = next(iter(sample_images()), None)
    if sample is not None:
        (model_dir / "warmup").mkdir()
        shutil.copy(sample, model_dir / "warmup" / sample.name)
        _warmup(config, model_dir / "warmup" / sample.name)
    write_config(model_dir, config)
    if cfg.trt_variant:
        _write_trt_variant(repo, engine, replace(cfg, kind=kind, img=img_size, preferred_batch=preferred))
    return model_dir


def _write_trt_variant(repo: Path, engine: Path, cfg: RepoConfig) -> None:
    """Pre/post-processing stay in python models around the tensorrt_plan model, so the ensemble keeps the API.
    The plan always runs on the GPU; `kind` places the python stages (cpu lets them be tested without one)."""
    name, max_batch, max_det, img_size, kind = cfg.name, cfg.max_batch, cfg.max_det, cfg.img, cfg.kind
    batching = (cfg.preferred_batch, cfg.queue_delay_us, cfg.max_queue)
    plan_dir = repo / f"{name}_plan" / "1"
    plan_dir.mkdir(parents=True, exist_ok=True)
    if engine.suffix == ".plan" and engine.exists():
        shutil.copy(engine, plan_dir / "model.plan")
    image = _tensor("images", mc.TYPE_FP16, [3, img_size, img_size])
    raw = _tensor("output0", mc.TYPE_FP16, [-1, -1])
    plan = mc.ModelConfig(name=f"{name}_plan", platform="tensorrt_plan", max_batch_size=max_batch)
    plan.input.add(**image)
    plan.output.add(**raw)
    _batching(plan, *batching)
    _instances(plan, cfg.instances, "gpu")
    write_config(plan_dir.parent, plan)

    meta = _tensor("META", mc.TYPE_FP32, [5])
    pre = mc.ModelConfig(name=f"{name}_pre", backend="python", max_batch_size=max_batch)
    pre.input.add(**_tensor("IMAGE", mc.TYPE_UINT8, [-1], allow_ragged_batch=True))
    pre.output.extend([mc.ModelOutput(**image), mc.ModelOutput(**meta)])
    _batching(pre, *batching)
    _instances(pre, 2, kind)  # one batching instance can leave a request queued for 0.5 s (RepoConfig.instances)
    _params(pre, {"img_size": img_size})
    post = mc.ModelConfig(name=f"{name}_post", backend="python", max_batch_size=max_batch)
    post.input.extend([mc.ModelInput(**raw), mc.ModelInput(**meta)])
    _outputs(post, max_det)
    _instances(post, 1, kind)
    _params(post, {"max_det": max_det, "conf": CONF, "iou": IOU})
    for stage, config in (("pre", pre), ("post", post)):
        d = repo / f"{name}_{stage}" / "1"
        d.mkdir(parents=True, exist_ok=True)
        install_model(f"{stage}.py", d)
        write_config(d.parent, config)

    ens = mc.ModelConfig(name=f"{name}_trt", platform="ensemble", max_batch_size=max_batch)
    ens.input.add(**_tensor("IMAGE", mc.TYPE_UINT8, [-1]))
    _outputs(ens, max_det)
    steps = [
        ("_pre", {"IMAGE": "IMAGE"}, {"images": "images", "META": "meta"}),
        ("_plan", {"images": "images"}, {"output0": "raw"}),
        ("_post", {"output0": "raw", "META": "meta"}, {"DETECTIONS": "DETECTIONS", "NUM_DETS": "NUM_DETS"}),
    ]
    for suffix, inputs, outputs in steps:
        ens.ensemble_scheduling.step.add(
            model_name=f"{name}{suffix}", model_version=-1, input_map=inputs, output_map=outputs
        )
    (repo / f"{name}_trt" / "1").mkdir(parents=True, exist_ok=True)
    write_config(repo / f"{name}_trt", ens)
