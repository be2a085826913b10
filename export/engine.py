"""One engine interface for val, predict, bench and the server: PyTorch (eager), ONNX Runtime (.onnx),
AOTInductor (.pt2) and TensorRT (.plan). Every engine takes a float batch (B, 3, H, W) in [0, 1] on its device
and returns decoded predictions (B, 4 + nc, anchors) in the official layout."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Protocol

import torch

from train import load_model
from train.model import DetectionModel

ENGINE_SUFFIXES = {".onnx": "onnx", ".pt2": "aoti", ".plan": "trt", ".engine": "trt"}


class Engine(Protocol):
    kind: str
    names: list[str]
    img_size: int
    device: torch.device
    dtype: torch.dtype  # the dtype the engine wants its input in

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def sidecar_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def read_sidecar(path: Path) -> dict:
    p = sidecar_path(path)
    return json.loads(p.read_text()) if p.exists() else {}


def deploy_model(model: DetectionModel) -> DetectionModel:
    """Training model -> fused GELAN inference model, in eval mode (the form every engine runs)."""
    return model.reparameterize().fuse().eval()


class TorchEngine:
    kind = "torch"

    def __init__(
        self, model: DetectionModel, device: str | torch.device = "cpu", half: bool = False, img_size: int = 640
    ):
        self.device = torch.device(device)
        self.dtype = torch.float16 if half else torch.float32
        self.model = deploy_model(model).to(self.device, self.dtype)
        if self.device.type == "cuda":  # channels-last lets cuDNN pick its fastest fp16 kernels
            self.model = self.model.to(memory_format=torch.channels_last)
            torch.backends.cudnn.benchmark = True  # inference shapes repeat (batch buckets): time algorithms once
        self.names, self.img_size = model.names, img_size

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        return self.model(x.to(self.device, self.dtype)).float()


class OnnxEngine:
    kind = "onnx"

    def __init__(self, path: Path, threads: int | None = None):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        meta = self.session.get_modelmeta().custom_metadata_map
        self.names = json.loads(meta.get("names", "[]"))
        self.img_size = int(meta.get("img_size", 640))
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.dtype = torch.float16 if "float16" in inp.type else torch.float32
        self.end2end = meta.get("end2end", "false") == "true"
        self.device = torch.device("cpu")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.session.run(None, {self.input_name: x.detach().cpu().to(self.dtype).numpy()})
        if self.end2end:
            raise TypeError("this ONNX file has NMS inside (end-to-end); use it with run_end2end()")
        return torch.from_numpy(out[0]).float()

    def run_end2end(self, x: torch.Tensor) -> list:
        return [torch.from_numpy(o) for o in self.session.run(None, {self.input_name: x.cpu().to(self.dtype).numpy()})]


class AOTIEngine:
    kind = "aoti"

    def __init__(self, path: Path, device: str | torch.device = "cuda"):
        meta = read_sidecar(path)
        self.names, self.img_size = meta.get("names", []), int(meta.get("img_size", 640))
        self.dtype = getattr(torch, meta.get("dtype", "float16"))
        self.device = torch.device(meta.get("device", str(device)))
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"{path} was compiled for CUDA and this machine has no CUDA GPU")
        if self.device.type == "cuda":  # the package's convolutions call cuDNN through ATen: time algorithms once
            torch.backends.cudnn.benchmark = True
        loader = os.environ.get("YOLOV9_AOTI_LOADER", "runner")
        if loader not in ("package", "runner"):
            raise ValueError(f"YOLOV9_AOTI_LOADER must be 'runner' or 'package', not {loader!r}")
        # single-threaded: no cross-thread synchronisation inside the model, which CUDA-graph capture requires
        if loader == "runner":
            self.runner = aoti_runner(path, self.device)
        else:
            self.runner = torch._inductor.aoti_load_package(str(path), run_single_threaded=True)

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.runner(x.to(self.device, self.dtype)).float()


def aoti_runner(path: Path, device: torch.device):
    """The package's compiled model opened directly with Inductor's container runner (one tensor in, one out).

    Same library as aoti_load_package() runs, but on the H200 this opens in 0.4 s where the package loader takes
    about 40 s. A .pt2 holds native code: load only packages you trust."""
    tmp = Path(tempfile.mkdtemp(prefix="yolov9_aoti_"))
    atexit.register(shutil.rmtree, tmp, True)  # kept while the process runs: CUDA kernels load lazily from it
    try:
        with zipfile.ZipFile(path) as z:
            z.extractall(tmp)  # zipfile drops absolute paths and '..' members
    except zipfile.BadZipFile as e:
        raise ValueError(f"{path} is not an AOTInductor package ({e})") from None
    libs = sorted(tmp.rglob("*.wrapper.so"))
    if len(libs) != 1:
        raise ValueError(f"{path}: expected one compiled model in the package, found {len(libs)}")
    so = str(libs[0])
    if device.type == "cuda":
        runner = torch._C._aoti.AOTIModelContainerRunnerCuda(so, 1, str(device), str(libs[0].parent), True)
    else:
        runner = torch._C._aoti.AOTIModelContainerRunnerCpu(so, 1)
    return lambda x: runner.run([x])[0]


def load_engine(spec: str | Path, device: str = "auto", half: bool | None = None, img_size: int = 640) -> Engine:
    """An engine from a file (.onnx/.pt2/.plan), a checkpoint, a config or a zoo name.

    device 'auto' means CUDA when present. For a checkpoint, `spec` may also be 'auto:WEIGHTS', which picks the
    fastest engine on this machine: a sibling .plan (TensorRT present), a sibling .pt2 (CUDA), PyTorch fp16 on
    CUDA, else a sibling .onnx (ONNX Runtime), else PyTorch fp32 on the CPU."""
    dev = torch.device(
        "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    )
    spec = str(spec)
    if spec.startswith("auto:"):
        return load_engine(pick_fastest(Path(spec[5:]), dev), device, half, img_size)
    path = Path(spec)
    kind = ENGINE_SUFFIXES.get(path.suffix)
    if kind == "onnx":
        return OnnxEngine(path)
    if kind == "aoti":
        return AOTIEngine(path, dev)
    if kind == "trt":
        from export.tensorrt import TensorRTEngine

        return TensorRTEngine(path)
    model = load_model(spec)
    return TorchEngine(model, dev, half=dev.type == "cuda" if half is None else half, img_size=img_size)


def engine_spec(engine: str | None, weights: str | None) -> str:
    """The --engine / WEIGHTS pair of val and predict as one load_engine() spec ('auto' picks the fastest)."""
    if engine == "auto":
        if not weights:
            raise ValueError("--engine auto needs WEIGHTS to look for exported engines beside")
        return f"auto:{weights}"
    spec = engine or weights
    if not spec:
        raise ValueError("give WEIGHTS or --engine")
    return spec


def pick_fastest(weights: Path, dev: torch.device) -> str:
    cuda = dev.type == "cuda"
    candidates = []
    if cuda:
        try:
            import tensorrt  # noqa: F401

            candidates.append(weights.with_suffix(".plan"))
        except ImportError:
            pass
        candidates.append(weights.with_suffix(".pt2"))
    if not cuda:
        candidates.append(weights.with_suffix(".onnx"))
    for c in candidates:
        if c.exists() and c != weights:
            return str(c)
    return str(weights)


class CudaGraphEngine:
    """Wraps a CUDA engine and replays one captured CUDA graph per input shape: a batch-1 call then costs one
    graph launch instead of hundreds of kernel launches (the launch-bound regime)."""

    def __init__(self, engine: Engine):
        self.inner = engine
        self.kind = engine.kind + "-graph"
        self.names, self.img_size, self.device, self.dtype = engine.names, engine.img_size, engine.device, engine.dtype
        self.graphs: dict[tuple, tuple] = {}
        # one memory pool for all shapes: replays never overlap and each output is copied out right after its
        # replay, so graphs may reuse each other's intermediate memory (11 batch buckets cost about one)
        self.pool = torch.cuda.graph_pool_handle() if torch.cuda.is_available() else None

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        key = tuple(x.shape)
        if key not in self.graphs:
            static_in = torch.zeros(key, device=self.device, dtype=self.dtype)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # warm up allocations and autotuning outside the capture
                    self.inner(static_in)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                static_out = self.inner(static_in)
            self.graphs[key] = (graph, static_in, static_out)
        graph, static_in, static_out = self.graphs[key]
        static_in.copy_(x)
        graph.replay()
        return static_out.clone()
