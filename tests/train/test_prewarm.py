"""The GPU warm-up before the first step (train/prewarm.py) runs a whole step on a copy and leaves the run's model,
its BatchNorm statistics, gradients and random streams as they were."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import tiny_train_config
from yolov9.core.model import DetectionModel, load_cfg
from yolov9.train.data.targets import target_capacity
from yolov9.train.gil import SHORT_SWITCH_INTERVAL_S
from yolov9.train.prewarm import BOXES, prewarm, synthetic_batch
from yolov9.train.step import StepOptions
from yolov9.train.trainer import Trainer, _beside


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _warm_and_check(device: torch.device, batch: int, img: int, opts: StepOptions, then=lambda: None) -> int:
    """Warms a gelan-t up and checks that nothing of the run moved; returns the GPU memory the warm-up left
    reserved beyond what the model itself holds."""
    torch.manual_seed(0)
    model = DetectionModel(load_cfg("gelan-t"), nc=3).to(device)
    before = _snapshot(model)
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    reserved = torch.cuda.memory_reserved(device) if cuda_rng is not None else 0
    parts, error = prewarm(model, batch, img, opts, then=then)
    assert error is None
    assert list(parts) == ["copy", "forward_backward", "optimizer", "release"]
    assert all(s >= 0 for s in parts.values()) and parts["forward_backward"] > 0
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "the run's model changed"
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    if cuda_rng is None:
        return 0
    assert torch.equal(torch.cuda.get_rng_state(device), cuda_rng)
    return torch.cuda.memory_reserved(device) - reserved


def test_synthetic_batch_has_the_runs_shape_and_valid_boxes():
    imgs, targets = synthetic_batch(4, 64, nc=5)
    assert imgs.shape == (4, 3, 64, 64) and imgs.dtype == torch.uint8
    n = 4 * BOXES
    assert targets.shape == (target_capacity(n), 6)
    assert (targets[n:] == 0).all()  # padding rows, as the captured step pads a batch
    assert torch.equal(targets[:n, 0], torch.arange(4).repeat_interleave(BOXES).float())  # in image order
    cls, xywh = targets[:n, 1], targets[:n, 2:]
    assert ((cls >= 0) & (cls < 5) & (cls == cls.round())).all()
    assert (xywh > 0).all() and (xywh[..., :2] + xywh[..., 2:] / 2 <= 1.0).all()


def test_prewarm_runs_a_whole_step_on_a_copy_and_changes_nothing():
    _warm_and_check(torch.device("cpu"), 2, 64, StepOptions(channels_last=False))


def test_prewarm_times_the_convolutions_before_it_builds_an_optimizer(monkeypatch):
    """An optimizer's first use imports torch._dynamo (seconds on a GPU box); the trainer's data thread imports it
    meanwhile, so the warm-up builds its optimizer only after the forward and backward."""
    import yolov9.train.prewarm as warm

    calls = []
    for name in ("synthetic_batch", "forward_backward", "build_optimizer"):
        real = getattr(warm, name)
        monkeypatch.setattr(warm, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    _warm_and_check(torch.device("cpu"), 2, 64, StepOptions(channels_last=False), then=lambda: calls.append("then"))
    # the data thread starts once the copy is made, so the copy's interpreter work does not share the lock with it
    assert calls == ["synthetic_batch", "then", "forward_backward", "build_optimizer"]


def test_the_warm_up_runs_at_a_short_switch_interval_and_restores_it(monkeypatch):
    """The warm-up's thread wins the interpreter lock back from the data thread after each operation; the
    interval is process-wide, so it is restored afterwards, also when the warm-up fails."""
    import yolov9.train.prewarm as warm

    seen = []
    real = warm.forward_backward
    monkeypatch.setattr(warm, "forward_backward", lambda *a, **k: seen.append(sys.getswitchinterval()) or real(*a, **k))
    before = sys.getswitchinterval()
    _warm_and_check(
        torch.device("cpu"), 2, 64, StepOptions(channels_last=False), then=lambda: seen.append(sys.getswitchinterval())
    )
    assert seen == [pytest.approx(SHORT_SWITCH_INTERVAL_S)] * 2
    assert sys.getswitchinterval() == before

    monkeypatch.setattr(warm, "forward_backward", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("CUDA error")))
    _, error = prewarm(DetectionModel(load_cfg("gelan-t"), nc=3), 2, 64, StepOptions(channels_last=False))
    assert error == "RuntimeError: CUDA error" and sys.getswitchinterval() == before


def test_the_data_thread_starts_even_when_the_warm_ups_copy_fails(monkeypatch):
    import yolov9.train.prewarm as warm

    def fail(*_a, **_k):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(warm, "synthetic_batch", fail)
    started, result = [], {}

    def here(start) -> None:  # as the trainer warms up beside its data thread
        result["parts"], result["error"] = prewarm(
            DetectionModel(load_cfg("gelan-t"), nc=3), 2, 64, StepOptions(), then=start
        )

    _beside(lambda: started.append(1), here)
    assert result["error"] == "RuntimeError: CUDA out of memory" and started == [1] and "copy" not in result["parts"]


def test_beside_starts_the_thread_when_the_caller_did_not():
    ran = []
    _beside(lambda: ran.append("work"), lambda start: ran.append("here"))
    assert ran == ["here", "work"]
    with pytest.raises(ValueError, match="bad data"):  # the thread's error is raised here
        _beside(lambda: (_ for _ in ()).throw(ValueError("bad data")), lambda start: start())


def test_a_failed_prewarm_says_why_and_the_model_is_untouched():
    model = DetectionModel(load_cfg("gelan-t"), nc=3)
    before = _snapshot(model)
    parts, error = prewarm(model, 2, 50, StepOptions(channels_last=False))  # 50 px: not a multiple of the stride
    assert error and "\n" not in error
    assert "forward_backward" not in parts and "release" in parts  # the parts that ran
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (what is warmed is cuDNN's timing)")
def test_prewarm_on_the_gpu_releases_the_copys_memory():
    torch.backends.cudnn.benchmark = True
    left = _warm_and_check(torch.device("cuda", 0), 16, 320, StepOptions(amp_dtype=torch.float16))
    assert left <= 64 * 2**20  # the libraries' workspaces at most, not the copy's activations


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the trainer warms a GPU only)")
def test_trainer_warms_the_gpu_before_its_first_step(tiny_subset, tmp_path):
    data = tmp_path / "data.yaml"
    data.write_text(
        f"path: {tiny_subset}\ntrain: images\nval: images\nnames: [{', '.join(f'c{i}' for i in range(80))}]\n"
    )
    run = Trainer(tiny_train_config(data, tmp_path, device="0", amp="fp16", epochs=1, name="warm")).fit()
    row = json.loads((Path(run["run_dir"]) / "results.jsonl").read_text().splitlines()[0])
    assert row["prewarm_s"] > 0 and row["prewarm_s"] >= row["prewarm_parts_s"]["forward_backward"] > 0
    assert row["cudnn_benchmark"] is False  # a run of a few images would not earn cuDNN's timing back
    stages = list(row["startup_s"])
    assert stages.index("model") < stages.index("prewarm") < stages.index("datasets") < stages.index("epoch_start")
    # beside the warm-up, in the data thread: torchvision, the datasets, the loader's workers
    at = row["startup_s"]
    assert at["model"] < at["data_imports"] <= at["data_ready"] <= at["loader"] <= at["datasets"]
    # what the first step asked CUDA for: device segments, and pinned blocks where this torch counts them
    allocations = row["first_step_allocations"]
    assert allocations["device_segments"] > 0
    if hasattr(torch.cuda, "host_memory_stats"):
        assert allocations["pinned_blocks"] > 0 and allocations["pinned_alloc_s"] >= 0


def test_the_loader_started_beside_the_warm_up_is_the_runs_loader(tiny_subset, tmp_path):
    """The loader the warm-up's thread starts serves the run when it starts at the state's epoch and batch (the same
    batches a loader started later would give), and is replaced when it does not."""
    data = tmp_path / "data.yaml"
    data.write_text(f"path: {tiny_subset}\ntrain: images\nnames: [{', '.join(f'c{i}' for i in range(80))}]\n")
    trainer = Trainer(tiny_train_config(data, tmp_path, workers=2, epochs=2))
    _beside(lambda: trainer._datasets_and_loader(*trainer._index()), lambda start: start())  # as the warm-up does
    started = trainer.started
    sampler = started[0].batch_sampler
    assert (sampler.start_epoch, sampler.batch) == (0, 8)
    assert list(trainer.startup)[-3:] == ["data_imports", "data_ready", "loader"]
    trainer._setup()
    loader, batches = trainer._running_loader(0)
    assert loader is started[0] and batches is started[1] and trainer.started is None
    later = trainer._loader(0, 8)[1]
    for _ in range(3):  # across the first epoch's end
        a, b = next(batches), next(later)
        assert torch.equal(a.images, b.images) and torch.equal(a.rows, b.rows)
    workers = loader._iterator._workers  # forked from the warm-up's thread: they must end as cleanly as others
    loader._iterator._shutdown_workers()
    assert [w.exitcode for w in workers] == [0, 0]
    trainer._datasets_and_loader(*trainer._index())
    started = trainer.started
    trainer.state.batch = 4  # as after halving on out-of-memory: the started loader's batch no longer fits
    loader, batches = trainer._running_loader(0)
    assert loader is not started[0] and loader.batch_sampler.batch == 4 and len(next(batches).images) == 4


_COMPILER_IMPORTS = """
import json, sys
from tests.conftest import tiny_train_config
from yolov9.train.trainer import Trainer, _beside
mode, data, project = sys.argv[1:]
trainer = Trainer(tiny_train_config(data, project, workers=2, compile=mode))
_beside(lambda: trainer._datasets_and_loader(*trainer._index()), lambda start: start())  # as the warm-up does
imported = "torch._inductor.compile_fx" in sys.modules
before = set(sys.modules)
trainer._setup()
setup_imports = len(set(sys.modules) - before)
loader = trainer.started[0]
next(trainer.started[1])
workers = loader._iterator._workers
loader._iterator._shutdown_workers()
print(json.dumps({"stages": list(trainer.startup), "imported": imported, "setup_imports": setup_imports,
                  "exitcodes": [w.exitcode for w in workers]}))
"""


@pytest.mark.parametrize("mode", ["layers", "off"])
def test_a_run_that_compiles_imports_the_compiler_beside_the_warm_up(mode, tiny_subset, tmp_path):
    """torch.compile's first use imports dynamo and inductor (seconds): a run that compiles imports them in the
    warm-up's thread once the loader's workers have forked (none inherits a held import lock), so its set-up before
    the first step imports little; a run that does not compile imports nothing more there."""
    data = tmp_path / "data.yaml"
    data.write_text(f"path: {tiny_subset}\ntrain: images\nnames: [{', '.join(f'c{i}' for i in range(80))}]\n")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _COMPILER_IMPORTS, mode, str(data), str(tmp_path)],
        capture_output=True, text=True, cwd=root, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["exitcodes"] == [0, 0]
    if mode == "off":
        assert "compiler_imports" not in got["stages"] and not got["imported"]
        return
    assert got["stages"][-4:] == ["data_imports", "data_ready", "loader", "compiler_imports"]
    assert got["imported"] and got["setup_imports"] < 50  # without the early import, about 600 modules
