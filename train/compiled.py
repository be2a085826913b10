"""torch.compile for training (`--compile`): inductor fuses what the profile shows taking most of a step's GPU time
(BatchNorm, SiLU, adds, concatenation and layout copies around the convolutions) and keeps fewer activations.

`CompiledForward` is the model's forward with its layers compiled, one region per layer (`layers`: repeated blocks
of one shape compile once, and a region's compile is cached on its own) or the model as one graph (`model`). It
compiles for static shapes, for the first input it sees; an input of another shape (an epoch's short last batch)
runs the uncompiled layers, so a new shape never costs a compile (a batch halved after CUDA ran out of memory
trains uncompiled from then on). `CompiledLoss` is the loss and its assigner as one graph for the prediction shapes
it first sees (mode `loss` compiles it alone, the forward modes with the forward), compiled once for any box count
(a symbolic dimension); the target rows are still padded to a power-of-two count (`target_capacity`, the loss
unchanged) so that the captured step sees few shapes. Eagerly the loss is thousands of small elementwise kernels
per step. The wrapped model is left as it is (state-dict keys, the EMA's copy and checkpoints are unchanged).
Inductor's caches live in the user's cache folder, so a second run of the same model and shape on a machine starts
without compiling again; a record beside them (`note_compiled`) tells `--compile auto` that it would."""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import os
import threading
from pathlib import Path

import torch
from torch import nn

from yolov9.core.model import DetectionModel, run_layers
from yolov9.train.cache_fill import CacheFill, apply_compile_settings, compile_settings, tensor_like, tensor_meta
from yolov9.train.data.targets import pad_rows, target_capacity
from yolov9.train.gil import switch_interval
from yolov9.train.loss import DetectionLoss

COMPILE_MODES = ("auto", "off", "loss", "layers", "model")
FORWARD_MODES = ("layers", "model")  # the modes that compile the model's forward


def cache_dir() -> Path:
    """Where inductor keeps its FX-graph, autograd and autotuning caches: $TORCHINDUCTOR_CACHE_DIR when set, else
    ~/.cache/yolov9/inductor ($XDG_CACHE_HOME honoured) instead of /tmp, which a reboot empties."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "yolov9" / "inductor"


def cache_counts() -> dict[str, int | float]:
    """This process's lookups in inductor's FX-graph and AOTAutograd caches so far, and the seconds torch.compile
    spent (tracing included, cache hits or not): a start from a warm cache shows hits and no misses, so a slow first
    step with misses means the cache did not serve it, and one with few compile seconds spent its time elsewhere
    (cuDNN's autotuning, the capture)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    fx, aot = counters["inductor"], counters["aot_autograd"]
    return {
        "compile_cache_hits": fx["fxgraph_cache_hit"] + aot["autograd_cache_hit"],
        "compile_cache_misses": fx["fxgraph_cache_miss"] + aot["autograd_cache_miss"],
        "compile_s": round(sum(compilation_time_metrics.get("_compile.compile_inner", [])), 1),
    }


def _configure() -> None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir())
    import torch._dynamo.config as dynamo

    # every block class's forward is one code object with one cache entry per instance shape: a model has more
    # than the default limit of 8 (past it dynamo silently runs the rest eagerly)
    dynamo.recompile_limit = max(dynamo.recompile_limit, 256)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 4096)


# Held by a background compile for as long as it runs: a CUDA graph capture (graphed_step.py) takes it first and
# waits for a later step when it cannot, as a capture could be broken by another thread's compile and kernel loads.
COMPILE_LOCK = threading.Lock()


class BackgroundCompile:
    """What a compiled part of the step (`CompiledForward`, `CompiledLoss`) needs to compile in a thread. With
    `background`, calls run uncompiled and keep a copy of the first call's inputs (`_example`) until
    `start_background()` (after the first steps) has compiled in a thread on that copy (forward and backward, so
    nothing is left to compile at the first compiled call) and `take_over()` (between steps) has switched to the
    compiled version; `version` then changes, which tells a captured step to capture again. With inductor
    (`fill_first`), a second process (`CacheFill`) compiles the part first, from the first call on, and the thread
    then compiles it from inductor's caches (at once, with no second process, when this machine compiled the part
    before); where the GPU has too little free memory for the thread's copy, the training thread compiles it from
    those caches at the takeover instead (`notice` says so)."""

    def _init_background(self, background: bool, backend: str, cached: bool) -> None:
        self.background, self.version, self.backend = background, 0, backend
        self._example: tuple | None = None  # the first call's inputs, for a background compile
        self._thread: threading.Thread | None = None
        self._compiled = False  # set by the thread; taken over by the training thread between steps
        self.failure: str | None = None  # why a background compile failed (the part then stays uncompiled)
        self.notice: str | None = None  # why the part compiles at the takeover instead (too little GPU memory)
        # the other backends keep no caches to fill; with `cached` (this machine compiled the part before) the cache
        # holds every graph already, and the thread takes them from there at once
        self.fill_first = background and backend == "inductor" and not cached
        self.fill: CacheFill | None = None

    @property
    def ready(self) -> bool:
        """Whether calls of the compiled shapes run compiled."""
        return not self.background or self.version > 0

    @property
    def filled(self) -> bool | None:
        """Whether the second process has ended (None without one)."""
        return None if self.fill is None else not self.fill.running()

    def start_background(self) -> None:
        """Compile in a thread now (once; a no-op unless `background` and a call of the compiled shapes came)."""
        if self.background and self._thread is None and self._example is not None:
            # the thread count is per thread in some builds and dynamo guards on it: the compiling thread takes the
            # training thread's, or the training thread would compile again at the takeover
            threads = torch.get_num_threads()
            name = f"compile-{type(self).__name__}"
            self._thread = threading.Thread(target=self._compile, args=(threads,), name=name, daemon=True)
            self._thread.start()

    def _keep_example(self, example: tuple) -> None:
        self._example = example
        if self.fill_first:
            self.fill = CacheFill(self.cache_spec())

    def stop(self) -> None:
        """End a compile still running in the second process (the run is over): the thread then compiles nothing."""
        if self.fill is not None:
            self.fill.stop()

    def take_over(self) -> bool:
        """Switch to what a finished background compile left; call between steps, never inside a capture (the
        thread itself does not switch: it could land in the middle of one). Returns `ready`."""
        if self._compiled and self.version == 0:
            self.version = 1
        return self.ready

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background compile; True once it has finished (or none was started)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def _compile(self, threads: int) -> None:
        if self.fill is not None:  # waits outside COMPILE_LOCK: the step's captures go on meanwhile
            failure = self.fill.wait()  # a stopped one's too
            if failure:  # what failed there would fail here too, and hold the training's lock
                self.failure, self._example = f"in a second process: {failure}", None
                return
        device = self._example_device()
        if (short := self._memory_short(device)) is not None:
            # the training thread compiles at the takeover instead: from the filled cache, on the model itself
            self.notice, self._example, self._compiled = short, None, True
            return
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        with COMPILE_LOCK, switch_interval():  # dynamo and inductor hold the interpreter for long stretches
            try:
                torch.set_num_threads(threads)
                if stream is not None:  # the copies were made on the training's stream
                    torch.cuda.synchronize(device)
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    self._compile_example()
                if stream is not None:
                    stream.synchronize()
                    torch.cuda.empty_cache()  # the copy's blocks, cached for this thread's stream alone
                self._compiled = True
            except Exception as e:  # the run goes on uncompiled
                self.failure = first_cause(e)
            finally:
                self._example = None

    def _memory_short(self, device: torch.device) -> str | None:
        """Why the GPU has too little free memory for `_compile_example` beside the run, or None."""
        needed = self._example_memory(device)
        if not needed:
            return None
        free, _ = torch.cuda.mem_get_info(device)
        if free >= needed:
            return None
        return f"{free / 2**30:.1f} GiB of GPU memory free, about {needed / 2**30:.1f} GiB needed beside the run"

    def _example_memory(self, device: torch.device) -> int:
        """GPU bytes `_compile_example` takes while it runs (0: too few to check)."""
        return 0

    def _example_device(self) -> torch.device:
        raise NotImplementedError

    def _compile_example(self) -> None:
        """Run the compiled version forward and backward on copies of `_example` (in the compiling thread)."""
        raise NotImplementedError

    def cache_spec(self) -> dict:
        """What the second process rebuilds this part and its `_example` from (`from_cache_spec`): plain values and
        CPU tensors, which torch.load(weights_only=True) reads."""
        device = self._example_device()
        return {"part": type(self).__name__, "backend": self.backend, "device": str(device),
                "settings": compile_settings()}  # fmt: skip


def fill_caches(spec: dict, device: torch.device) -> dict:
    """In the second process (cache_fill_worker.py): compile the part `spec` describes, forward and backward, as the
    thread would; its kernels and their autotuning stay in inductor's caches. Returns torch.compile's counts."""
    from torch._dynamo.utils import counters

    apply_compile_settings(spec["settings"])
    parts = {cls.__name__: cls for cls in (CompiledForward, CompiledLoss)}
    if spec.get("part") not in parts:
        raise ValueError(f"no compiled part named {spec.get('part')!r}")
    part = parts[spec["part"]].from_cache_spec(spec, device)
    part._compile_example()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {**cache_counts(), "graphs": counters["stats"]["unique_graphs"]}


class CompiledForward(BackgroundCompile, nn.Module):
    """Call like the model; parameters are the model's. mode: 'layers' or 'model' (see the module's docstring);
    backend: torch.compile's (the CPU tests trace with 'eager', which compiles nothing); background: compile in a
    thread (`BackgroundCompile`) on a copy of the model: dynamo keeps what it compiled per code object, not per
    module, so the model's own compiled layers then run it without compiling again. The copy's forward and
    backward at the run's batch take about as much GPU memory again as the step while they run in 'model' mode; in
    'layers' mode they run one layer at a time (`_layer_by_layer`), a fraction of that."""

    def __init__(
        self,
        model: DetectionModel,
        mode: str = "layers",
        backend: str = "inductor",
        background: bool = False,
        cached: bool = False,
    ):
        super().__init__()
        if mode not in FORWARD_MODES:
            raise ValueError(f"compile mode {mode!r}: choose {', '.join(FORWARD_MODES)}")
        _configure()
        self._init_background(background, backend, cached)
        self.model, self.mode = model, mode
        # plain attributes, not submodules: the parameters are registered once, through self.model
        self.__dict__["_calls"] = self._compiled_calls(model)
        self.key: tuple | None = None  # the one input signature that runs compiled

    def _compiled_calls(self, model: DetectionModel):
        if self.mode == "layers":
            return [torch.compile(m, dynamic=False, backend=self.backend) for m in model.model]
        return torch.compile(model, dynamic=False, backend=self.backend)

    def _run(self, model: DetectionModel, calls, x: torch.Tensor):
        return run_layers(model.model, calls, model.save, x) if self.mode == "layers" else calls(x)

    def forward(self, x: torch.Tensor):
        key = (tuple(x.shape), x.dtype, self.model.training, torch.is_grad_enabled())
        if self.key is None:
            self.key = key
        if key != self.key:
            return self.model(x)
        if not self.ready:
            if self._example is None:  # the input and the autocast it runs under, which dynamo guards on
                dev = x.device.type
                amp = (torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev), torch.is_autocast_cache_enabled())
                self._keep_example((x.detach().clone(), amp))
            return self.model(x)
        return self._run(self.model, self.__dict__["_calls"], x)

    def _example_device(self) -> torch.device:
        return self._example[0].device

    def _example_memory(self, device: torch.device) -> int:
        if device.type != "cuda":
            return 0
        # 'model': the twin's forward and backward at the run's batch repeat the step's activations, the run's peak
        # so far; 'layers': one layer's at a time (with the outputs later layers read), a fraction of that
        peak = torch.cuda.max_memory_allocated(device)
        return peak if self.mode == "model" else peak // 4

    def _compile_example(self) -> None:
        x, (enabled, dtype, cache) = self._example
        twin = copy.deepcopy(self.model)  # the run's model trains beside this thread: its values do not matter here
        calls = self._compiled_calls(twin)
        amp = functools.partial(torch.autocast, x.device.type, dtype=dtype, enabled=enabled, cache_enabled=cache)
        if self.mode == "layers":
            _layer_by_layer(twin, calls, x.clone(), amp)
            return
        with amp():
            out = self._run(twin, calls, x.clone())  # as the step's input: no gradient
        _backward_of_sum(out)

    def cache_spec(self) -> dict:
        x, (enabled, dtype, cache) = self._example
        weights = [p for p in self.model.parameters() if p.dim() == 4]
        channels_last = all(w.is_contiguous(memory_format=torch.channels_last) for w in weights)
        return {**super().cache_spec(), "cfg": self.model.cfg, "mode": self.mode, "channels_last": channels_last,
                "input": tensor_meta(x), "autocast": [enabled, str(dtype).removeprefix("torch."), cache]}  # fmt: skip

    @classmethod
    def from_cache_spec(cls, spec: dict, device: torch.device) -> CompiledForward:
        model = DetectionModel(spec["cfg"]).to(device).train()
        if spec["channels_last"]:
            model = model.to(memory_format=torch.channels_last)
        part = cls(model, spec["mode"], spec["backend"])
        enabled, dtype, cache = spec["autocast"]
        part._example = (tensor_like(spec["input"], device), (enabled, getattr(torch, dtype), cache))
        return part


def _tensors(out) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in _tensors(o)]


def _backward_of_sum(out) -> None:
    """Backward from the sum of every tensor in `out`: each output's backward graph compiles (its values do not
    matter to the compile)."""
    sum(t.float().sum() for t in _tensors(out)).backward()


def _detached(out):
    """`out` (a tensor or nested lists of them) cut from its graph, each tensor still asking for gradients as it
    did: the next layer's input looks to dynamo's guards as it does in the run."""
    if isinstance(out, torch.Tensor):
        return out.detach().requires_grad_(out.requires_grad)
    return type(out)(_detached(o) for o in out)


def _layer_by_layer(model: DetectionModel, calls, x: torch.Tensor, amp) -> None:
    """Each compiled layer's forward (under `amp`) and then its backward, in the forward's order, on the earlier
    layers' outputs cut from their graphs: every forward and backward graph compiles as in a whole forward, while
    only one layer's activations (and the outputs later layers read) are held at a time, not a whole step's beside
    the run's."""

    def forward_backward(call):
        def run(inputs):
            with amp():
                out = call(inputs)
            _backward_of_sum(out)
            return _detached(out)

        return run

    run_layers(model.model, [forward_backward(call) for call in calls], model.save, x)


class CompiledLoss(BackgroundCompile):
    """Call like the `DetectionLoss` it wraps; `DetectionLoss.terms` compiled as one graph (fullgraph: a graph
    break would mean a host synchronisation, which the captured step cannot take). With `background`, compiled in
    a thread (`BackgroundCompile`)."""

    def __init__(self, loss: DetectionLoss, backend: str = "inductor", background: bool = False, cached: bool = False):
        _configure()
        self._init_background(background, backend, cached)
        self.loss = loss
        self._terms = torch.compile(loss.terms, dynamic=False, fullgraph=True, backend=backend)
        self.key: tuple | None = None  # the prediction shapes that run compiled

    def __call__(self, preds, targets: torch.Tensor):
        heads = self.loss.heads(preds)
        key = tuple((tuple(f.shape), f.dtype) for feats in heads for f in feats)
        if self.key is None:
            self.key = key
        if key != self.key:  # e.g. an epoch's short last batch
            return self.loss(preds, targets)
        gt = pad_rows(targets, target_capacity(targets.shape[0]))
        if not self.ready:
            if self._example is None:
                self._keep_example(([[f.detach().clone() for f in feats] for feats in heads], gt.clone()))
            return self.loss(heads, gt)
        torch._dynamo.mark_dynamic(gt, 0)  # the box count is symbolic: one compile serves every capacity of a run
        return self._terms(heads, gt, *self.loss.constants(heads[0]))

    def _example_device(self) -> torch.device:
        return self._example[1].device

    def _compile_example(self) -> None:
        heads, gt = self._example
        heads = [[f.clone().requires_grad_() for f in feats] for feats in heads]
        torch._dynamo.mark_dynamic(gt, 0)
        self._terms(heads, gt, *self.loss.constants(heads[0]))[0].backward()

    def cache_spec(self) -> dict:
        heads, gt = self._example
        return {**super().cache_spec(), "loss": self.loss.settings(), "gt": gt.cpu(),
                "heads": [[tensor_meta(f) for f in feats] for feats in heads]}  # fmt: skip

    @classmethod
    def from_cache_spec(cls, spec: dict, device: torch.device) -> CompiledLoss:
        part = cls(DetectionLoss.from_settings(spec["loss"]), spec["backend"])
        part._example = ([[tensor_like(m, device) for m in feats] for feats in spec["heads"]], spec["gt"].to(device))
        return part


def first_cause(e: BaseException) -> str:
    """The innermost cause of an error in one line (torch.compile wraps a backend's error in its own)."""
    while (inner := e.__cause__ or getattr(e, "inner_exception", None)) is not None:
        e = inner
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[0].strip()}" if lines else type(e).__name__


# --compile auto's thresholds in training images (epochs x images), from a 4,096-image run on one GPU
# (benchmarks.md): `layers` trains about 1.2-1.4x the uncompiled rate and 1.1x the loss alone's. Compiled before the
# first step, it costs about 20 s more at the start from inductor's cache and about 4 minutes the first time; the
# loss alone about a minute the first time. Compiled beside the run (--compile-background), the first steps start
# at once and a cold compile costs the run 0-8% until the loss takes over (about 80 s) and the layers (about 5
# minutes; from the cache the first step comes 20 s sooner than compiling first and the compiled step about two
# minutes later), so a run that earns back the loss's compile earns back the layers' as well.
AUTO_MIN_IMAGES = 300_000  # a shorter run does not earn back a cold compile of the loss
AUTO_LAYERS_WARM = 40_000  # from the cache, `layers` pays back after this many
AUTO_LAYERS_COLD = 1_500_000  # the first time, before the first step, `layers` beats the loss alone after this many


def resolve_mode(
    mode: str,
    device: torch.device,
    distributed: bool,
    images: int | None = None,
    compiled_before: bool = False,
    background: bool = False,
) -> str:
    """--compile auto on one CUDA GPU: `layers` for a run that earns back its compile (`images` training images,
    None for a steady-state benchmark; `compiled_before`: this machine compiled the same model and shape, so it
    comes from the cache; `background`: compiled beside the run), else `loss` for a run that earns back the loss's
    compile, else uncompiled. Off on the CPU (inductor's C++ compile there costs more than CPU runs gain) and under
    torchrun (not measured there)."""
    if mode != "auto":
        return mode
    if device.type != "cuda" or distributed:
        return "off"
    if images is None or images >= AUTO_LAYERS_COLD or (compiled_before and images >= AUTO_LAYERS_WARM):
        return "layers"
    if images >= AUTO_MIN_IMAGES:
        return "layers" if background else "loss"
    return "off"


def signature(model: nn.Module, batch: int, img: int, dtype: torch.dtype | None, **options) -> dict:
    """What a forward compile depends on: the model's layers and parameter shapes, the batch shape and precision,
    the GPU and torch's version, and `options` (channels-last, the loss compiled, ...)."""
    shapes = hashlib.sha256(repr([(n, tuple(p.shape)) for n, p in model.named_parameters()]).encode()).hexdigest()
    device = next(model.parameters()).device
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"model": shapes[:16], "batch": batch, "img": img, "dtype": str(dtype), "gpu": gpu,
            "torch": torch.__version__, **options}  # fmt: skip


def _record(sig: dict) -> Path:
    digest = hashlib.sha256(json.dumps(sig, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir() / "yolov9-compiled" / f"{digest}.json"


def compiled_before(sig: dict) -> bool:
    """Whether a run on this machine compiled the forward for `sig` (inductor's cache then holds its kernels)."""
    return _record(sig).is_file()


def note_compiled(sig: dict, seconds: float | None = None) -> None:
    """Record that the forward for `sig` compiled and trained, for --compile auto's next choice. Best effort: a
    read-only cache folder only means the next run decides as on a new machine."""
    path = _record(sig)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**sig, "compile_s": seconds}, indent=1))


def import_compiler() -> None:
    """Import what torch.compile loads at its first use (dynamo, and inductor as its backend): seconds of a start,
    which the trainer spends beside the GPU's warm-up rather than on the way to the first step."""
    import torch._dynamo.convert_frame  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401
    from torch._dynamo.backends.registry import lookup_backend

    lookup_backend("inductor")


def compiled(model: DetectionModel, mode: str, background: bool = False, cached: bool = False) -> nn.Module:
    """The module the training step runs: its `CompiledForward` in the forward modes (compiled in a thread with
    `background`, without a second process first when `cached`), else the model itself."""
    if mode not in FORWARD_MODES:
        return model
    return CompiledForward(model, mode, background=background, cached=cached)


def loss_compiled(mode: str, enabled: bool = True) -> bool:
    """Whether mode compiles the loss: 'loss' does, the forward modes do unless disabled (--no-compile-loss)."""
    return mode == "loss" or (mode in FORWARD_MODES and enabled)


def compiled_loss(
    loss: DetectionLoss, mode: str, enabled: bool = True, background: bool = False, cached: bool = False
) -> DetectionLoss | CompiledLoss:
    """The loss the training step runs: `CompiledLoss` where `loss_compiled` says so (compiled in the background
    with `background`, without a second process first when `cached`), else the loss itself."""
    return CompiledLoss(loss, background=background, cached=cached) if loss_compiled(mode, enabled) else loss
