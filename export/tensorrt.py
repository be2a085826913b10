"""TensorRT engines: build a serialized FP16 engine from ONNX with the TensorRT Python API (10.x and 11.x), and
run one through the engine interface. Kept small on purpose: TensorRT is not installable on our own machines,
so this module is exercised where `tensorrt` imports and a CUDA GPU exists (NGC containers, user machines).

TensorRT 10: fp32 ONNX + BuilderFlag.FP16 (weak typing). TensorRT 11 removed weak typing: the network is
strongly typed, so precision comes from the graph, and we build from an fp16 ONNX."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from yolov9.core.errors import Unavailable
from yolov9.export.metadata import EngineMeta

INSTALL_HINT = (
    "TensorRT is not installed: pip install tensorrt --extra-index-url https://pypi.nvidia.com "
    "(or run inside an NGC TensorRT/Triton container)"
)


def import_tensorrt():
    try:
        import tensorrt as trt
    except ImportError:
        raise Unavailable(INSTALL_HINT) from None
    return trt


def _major(trt) -> int:
    return int(trt.__version__.split(".")[0])


def needs_fp16_onnx() -> bool:
    """TensorRT >= 11 builds strongly typed networks only: feed it an fp16 graph for an fp16 engine."""
    return _major(import_tensorrt()) >= 11


@dataclass(frozen=True)
class BuildProfile:
    """The engine's batch range (the optimization profile), the builder's workspace and its timing cache file."""

    min_batch: int = 1
    opt_batch: int = 16
    max_batch: int = 64
    workspace_gib: float = 4.0
    timing_cache: str | Path | None = None


def build_engine(
    onnx_path: str | Path, out: str | Path, build: BuildProfile = BuildProfile(), fp16: bool = True
) -> Path:
    trt = import_tensorrt()
    min_batch, opt_batch, max_batch = build.min_batch, build.opt_batch, build.max_batch
    workspace_gib, timing_cache = build.workspace_gib, build.timing_cache
    onnx_path, out = Path(onnx_path), Path(out)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    major = _major(trt)
    strongly = major >= 11
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if strongly else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise Unavailable(f"{onnx_path}: TensorRT could not parse it: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * 2**30))
    if fp16 and not strongly:
        config.set_flag(trt.BuilderFlag.FP16)
    cache_path = Path(timing_cache) if timing_cache else None
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path and cache_path.exists() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    inp = network.get_input(0)
    _, c, h, w = inp.shape
    profile = builder.create_optimization_profile()
    profile.set_shape(inp.name, (min_batch, c, h, w), (opt_batch, c, h, w), (max_batch, c, h, w))
    config.add_optimization_profile(profile)
    t0 = time.time()
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise Unavailable(f"{onnx_path}: TensorRT engine build failed (see the TensorRT log above)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(bytes(plan))  # the raw plan, as Triton's tensorrt_plan backend expects it
    if cache_path:
        cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    io = [_tensor_info(network.get_input(i)) for i in range(network.num_inputs)]
    io += [_tensor_info(network.get_output(i)) for i in range(network.num_outputs)]
    props = torch.cuda.get_device_properties(0)
    meta = EngineMeta.read(onnx_path)
    meta.device = "cuda"  # the input dtype stays that of the ONNX graph
    meta.extra = {
        "io": io,
        "tensorrt": trt.__version__,
        "gpu": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "build": {
            "fp16": fp16,
            "strongly_typed": strongly,
            "min_batch": min_batch,
            "opt_batch": opt_batch,
            "max_batch": max_batch,
            "workspace_gib": workspace_gib,
            "seconds": round(time.time() - t0, 1),
            "onnx": onnx_path.name,
        },
    }
    meta.write(out)
    return out


def _tensor_info(t) -> dict:
    return {"name": t.name, "shape": list(t.shape), "dtype": str(t.dtype)}


class TensorRTEngine:
    """Runs a .plan on the current CUDA stream with torch-allocated buffers."""

    kind = "trt"

    def __init__(self, path: str | Path):
        trt = import_tensorrt()
        self.trt = trt
        path = Path(path)
        self.meta = EngineMeta.read(path)
        self.names, self.img_size = self.meta.names, self.meta.img_size
        self.device = torch.device("cuda")
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.engine = trt.Runtime(self.logger).deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise Unavailable(f"{path}: not a TensorRT engine for this TensorRT version and GPU")
        self.context = self.engine.create_execution_context()
        self.inputs, self.outputs = [], []
        for i in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(i)
            is_input = self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            (self.inputs if is_input else self.outputs).append(name)
        self.dtype = self._torch_dtype(self.engine.get_tensor_dtype(self.inputs[0]))

    def _torch_dtype(self, dt):
        trt = self.trt
        return {
            trt.float32: torch.float32,
            trt.float16: torch.float16,
            trt.int32: torch.int32,
            trt.int64: torch.int64,
            trt.bool: torch.bool,
        }[dt]

    def run(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = x.to(self.device, self.dtype).contiguous()
        self.context.set_input_shape(self.inputs[0], tuple(x.shape))
        self.context.set_tensor_address(self.inputs[0], x.data_ptr())
        outs = []
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            t = torch.empty(shape, dtype=self._torch_dtype(self.engine.get_tensor_dtype(name)), device=self.device)
            self.context.set_tensor_address(name, t.data_ptr())
            outs.append(t)
        if not self.context.execute_async_v3(torch.cuda.current_stream().cuda_stream):
            raise Unavailable("TensorRT execution failed")
        return outs

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)[0].float()
