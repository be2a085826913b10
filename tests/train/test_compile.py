"""`--compile`: the compiled forward computes what the model computes, compiles once for the first input shape and
runs any other shape uncompiled, and leaves the model (its keys, its EMA copy) as it was. On the CPU dynamo traces
with its 'eager' backend (inductor's C++ compile of even a small model takes minutes on two cores); the inductor
path with CUDA graphs is tested on the GPU in test_step.py."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from tests.conftest import boxes_in_first_image, outputs
from yolov9.core.model import DetectionModel
from yolov9.train.compiled import (
    AUTO_LAYERS_COLD,
    AUTO_LAYERS_WARM,
    AUTO_MIN_IMAGES,
    CompiledForward,
    CompiledLoss,
    cache_dir,
    compiled,
    compiled_before,
    compiled_loss,
    note_compiled,
    resolve_mode,
    signature,
)
from yolov9.train.gil import SHORT_SWITCH_INTERVAL_S


@pytest.mark.parametrize(("cfg", "mode"), [("gelan-t", "layers"), ("yolov9-t", "model")])
def test_compiled_forward_traces_once_and_runs_other_shapes_uncompiled(cfg, mode):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = DetectionModel(cfg, nc=3).train()
    keys = list(model.state_dict())
    net = CompiledForward(model, mode, backend="eager")
    x = torch.rand(2, 3, 64, 64)
    got = net(x)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= (1 if mode == "model" else len(model.model) // 2)
    want = model(x)
    for a, b in zip(outputs(got), outputs(want), strict=True):
        torch.testing.assert_close(a, b)
    net(torch.rand(2, 3, 64, 64))  # the same shape again: no new trace
    short = torch.rand(1, 3, 64, 64)  # an epoch's short last batch
    for a, b in zip(outputs(net(short)), outputs(model(short)), strict=True):
        torch.testing.assert_close(a, b)
    assert counters["stats"]["unique_graphs"] == graphs
    sum(t.float().square().mean() for t in outputs(net(x))).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert list(model.state_dict()) == keys and list(net.parameters()) == list(model.parameters())
    plain = copy.deepcopy(model)  # what ModelEMA and checkpoints copy: the model, not its compiled regions
    assert type(plain) is DetectionModel and not hasattr(plain, "_calls")


def test_compile_off_is_the_model_itself_and_loss_compiles_the_loss_alone():
    from yolov9.train.loss import DetectionLoss

    model = DetectionModel("gelan-t", nc=3)
    loss = DetectionLoss.for_model(model)
    assert compiled(model, "off") is model and compiled_loss(loss, "off") is loss
    assert compiled(model, "loss") is model and isinstance(compiled_loss(loss, "loss"), CompiledLoss)
    assert isinstance(compiled_loss(loss, "layers"), CompiledLoss) and compiled_loss(loss, "layers", False) is loss
    with pytest.raises(ValueError, match="choose layers, model"):
        CompiledForward(model, "everything")


def test_auto_compiles_what_a_run_of_its_length_earns_back():
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")  # devices as values: no GPU needed
    assert resolve_mode("auto", gpu, False) == "layers"  # a benchmark: steady state
    assert resolve_mode("auto", gpu, False, AUTO_LAYERS_COLD) == "layers"
    assert resolve_mode("auto", gpu, False, AUTO_LAYERS_COLD - 1) == "loss"  # the cold forward compile would not pay
    assert resolve_mode("auto", gpu, False, AUTO_LAYERS_WARM, compiled_before=True) == "layers"  # from the cache
    assert resolve_mode("auto", gpu, False, AUTO_LAYERS_WARM - 1, compiled_before=True) == "off"
    assert resolve_mode("auto", gpu, False, AUTO_MIN_IMAGES) == "loss"
    assert resolve_mode("auto", gpu, False, AUTO_MIN_IMAGES - 1) == "off"  # the first compile would not pay
    # compiled beside the run, the first compile costs little: the layers wherever the loss alone would pay
    assert resolve_mode("auto", gpu, False, AUTO_MIN_IMAGES, background=True) == "layers"
    assert resolve_mode("auto", gpu, False, AUTO_MIN_IMAGES - 1, background=True) == "off"
    assert resolve_mode("auto", gpu, True) == "off"  # under torchrun
    assert resolve_mode("auto", cpu, False) == "off"
    assert resolve_mode("layers", cpu, False, 10) == "layers"  # asked for: as asked


def test_a_compiled_forward_is_remembered_per_model_and_shape(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = DetectionModel("gelan-t", nc=2)
    sig = signature(model, 16, 640, torch.float16, channels_last=True)
    assert not compiled_before(sig)
    note_compiled(sig, 12.5)
    assert compiled_before(sig)
    assert not compiled_before(signature(model, 32, 640, torch.float16, channels_last=True))  # another batch
    assert not compiled_before(signature(DetectionModel("gelan-t", nc=3), 16, 640, torch.float16, channels_last=True))
    assert not compiled_before(signature(model, 16, 640, torch.bfloat16, channels_last=True))
    blocked = tmp_path / "blocked"  # a cache folder where the record cannot be written: no error, nothing remembered
    blocked.mkdir()
    (blocked / "yolov9-compiled").write_text("a file where the folder would go")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(blocked))
    note_compiled(sig, None)
    assert not compiled_before(sig)


def test_inductor_cache_lives_in_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "yolov9" / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "own"))
    assert cache_dir() == tmp_path / "own"


def test_a_background_compile_starts_once_the_optimizer_step_is_captured_too():
    """A capture waits while a background compile holds COMPILE_LOCK, so the compile starts only once the micro-batch
    and the optimizer step are both captured: started after the micro-batch's capture alone, it left the optimizer
    step eager (clip, step and EMA as many small kernels) for as long as it compiled."""
    from types import SimpleNamespace

    from yolov9.train.engine import TrainStep
    from yolov9.train.loss import DetectionLoss
    from yolov9.train.step import StepOptions, build_optimizer, make_scaler

    def broken(gm, example_inputs):
        raise RuntimeError("no compiler here")

    torch._dynamo.reset()
    model = DetectionModel("gelan-t", nc=3).train()
    loss_fn = DetectionLoss.for_model(model)
    opt = build_optimizer(model, "SGD", 0.01, 0.937, 5e-4)
    step = TrainStep(model, model, loss_fn, opt, make_scaler(torch.device("cpu"), None), None, StepOptions())
    step.loss_fn = CompiledLoss(loss_fn, backend=broken, background=True)
    step.loss_fn(model(torch.rand(2, 3, 64, 64)), boxes_in_first_image(5, nc=3))  # the example to compile on
    # the captured parts as a GPU run has them after its first micro-batch (the CPU captures nothing)
    step.graphed = SimpleNamespace(graph="captured", eager_only=False)
    step.graphed_opt = SimpleNamespace(graph=None)  # the warm-up's momentum ramp: not captured yet
    step._start_background()
    assert step.loss_fn._thread is None
    step.graphed_opt.graph = "captured"
    step._start_background()
    assert step.loss_fn._thread is not None and step.loss_fn.wait(timeout=120)


@pytest.mark.parametrize("cfg", ["gelan-t", "yolov9-t"])
def test_compiled_loss_is_one_graph_equal_to_the_loss_and_other_shapes_run_uncompiled(cfg):
    """fullgraph tracing fails on any graph break (a host synchronisation the captured step could not take); the
    target rows are padded to a power-of-two count, which leaves the loss as it is."""
    from torch._dynamo.utils import counters

    from yolov9.train.compiled import CompiledLoss
    from yolov9.train.data.targets import pad_rows
    from yolov9.train.loss import DetectionLoss

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = DetectionModel(cfg, nc=3).train()
    loss_fn = DetectionLoss.for_model(model)
    net = CompiledLoss(loss_fn, backend="eager")
    preds = model(torch.rand(2, 3, 64, 64))
    rows = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.4], [0, 2, 0.3, 0.6, 0.2, 0.2], [1, 0, 0.4, 0.4, 0.5, 0.5]])
    want = loss_fn(preds, rows)
    for got in (net(preds, rows), net(preds, pad_rows(rows, 64))):
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])
    assert counters["stats"]["unique_graphs"] == 1  # 3 rows pad to 64
    # 73 rows pad to 128: the row count is symbolic, so the same graph serves it
    many = torch.cat([rows, torch.cat([torch.zeros(70, 1), torch.rand(70, 1) * 3 // 1, torch.rand(70, 4) * 0.3
                                      + 0.2], 1)])  # fmt: skip
    torch.testing.assert_close(net(preds, many)[0], loss_fn(preds, many)[0])
    assert counters["stats"]["unique_graphs"] == 1
    short = model(torch.rand(1, 3, 64, 64))
    torch.testing.assert_close(net(short, rows[:2])[0], loss_fn(short, rows[:2])[0])
    assert counters["stats"]["unique_graphs"] == 1
    w = next(model.parameters())
    net(preds, rows)[0].backward()
    assert w.grad is not None and torch.isfinite(w.grad).all()


def test_compiled_loss_gradients_equal_the_losss_at_every_box_count():
    """Through AOTAutograd (inductor's front half: the forward and backward graphs it would generate kernels for),
    with the box count symbolic: two capacities, one compile, the model's gradients as eager ones."""
    from torch._dynamo.utils import counters

    from yolov9.train.compiled import CompiledLoss
    from yolov9.train.loss import DetectionLoss

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = DetectionModel("gelan-t", nc=3).train()
    loss_fn = DetectionLoss.for_model(model)
    net = CompiledLoss(loss_fn, backend="aot_eager")
    x = torch.rand(2, 3, 64, 64)
    for boxes in (3, 100):  # all in the first image: capacities 64 and 128
        rows = boxes_in_first_image(boxes, nc=3)
        grads = []
        for fn in (loss_fn, net):
            model.zero_grad()
            fn(model(x), rows)[0].backward()
            grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
        assert len(grads[0]) == len(grads[1]) > 0
        for want, got in zip(*grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1


def test_compiled_loss_serves_every_box_count_where_the_eager_assigner_chunks():
    """Eagerly the assigner goes through its box rows in chunks; chunked by the symbolic row count, each new count
    that changed the chunks would recompile the loss (seen on the H200 as a second compile mid-epoch), so compiled it
    takes them whole. Here the chunks are forced small, so row counts padded to 64, 128 and 256 chunk eagerly."""
    from torch._dynamo.utils import counters

    from yolov9.train.loss import DetectionLoss

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = DetectionModel("gelan-t", nc=3).train()
    loss_fn = DetectionLoss.for_model(model)
    preds = model(torch.rand(4, 3, 64, 64))
    anchors = sum(f.shape[2] * f.shape[3] for f in loss_fn.heads(preds)[0])
    loss_fn.assigner.max_elements = 8 * anchors  # eagerly, eight box rows a chunk
    net = CompiledLoss(loss_fn, backend="eager")
    for boxes in (3, 100, 200):  # capacities 64, 128, 256
        rows = boxes_in_first_image(boxes, nc=3)
        got, want = net(preds, rows), loss_fn(preds, rows)
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])
    assert counters["stats"]["unique_graphs"] == 1


def test_cache_counts_tell_a_cold_compile_from_a_warm_one(monkeypatch, tmp_path):
    """What the first epoch's row reports: misses when inductor compiles into an empty cache, hits only when the
    same graph comes again from it (here after dynamo forgets its compiled code, as a new process would)."""
    from torch._dynamo.utils import counters

    from yolov9.train.compiled import cache_counts

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    x = torch.rand(8, 8)

    def f(t):
        return (t.sin() * 2 + 1).sum(0)

    counters.clear()
    torch._dynamo.reset()
    torch.compile(f, backend="inductor")(x)
    cold = cache_counts()
    assert cold["compile_cache_misses"] >= 1 and cold["compile_cache_hits"] == 0
    assert cold["compile_s"] > 0  # inductor's C++ compile of f took time
    counters.clear()
    torch._dynamo.reset()
    torch.compile(f, backend="inductor")(x)
    warm = cache_counts()
    assert warm["compile_cache_misses"] == 0 and warm["compile_cache_hits"] >= 1


def test_loss_compiled_in_the_background_runs_uncompiled_until_ready_then_compiled(request):
    """Until the thread's compile is done every call runs the uncompiled loss, also while the thread traces the same
    code; then calls run the graph compiled there (no second compile in the calling thread) with the same loss
    and gradients."""
    from torch._dynamo.utils import counters

    from yolov9.train.loss import DetectionLoss

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = DetectionModel("gelan-t", nc=3).train()
    loss_fn = DetectionLoss.for_model(model)
    runs = []  # calls of the compiled graph

    def counting(gm, example_inputs):
        from torch._dynamo.backends.debugging import aot_eager

        graph = aot_eager(gm, example_inputs)
        return lambda *args: runs.append(1) or graph(*args)

    net = CompiledLoss(loss_fn, backend=counting, background=True)
    x, rows = torch.rand(2, 3, 64, 64), boxes_in_first_image(5, nc=3)
    # dynamo guards on the thread count, per thread in some builds (the GPU box's): the compiling thread must take
    # the training thread's
    threads = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(threads))  # restored for the other tests, pass or fail
    torch.set_num_threads(1 if threads > 1 else 2)

    def check() -> None:
        model.zero_grad()
        got = net(model(x), rows)
        got[0].backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad()
        want = loss_fn(model(x), rows)
        want[0].backward()
        torch.testing.assert_close(got[1], want[1])
        for g, w in zip(grads, [p.grad for p in model.parameters() if p.grad is not None], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)

    check()
    assert not net.ready and net.version == 0 and counters["stats"]["unique_graphs"] == 0 and not runs
    net.start_background()
    while not net.wait(timeout=0):  # the uncompiled loss beside the tracing thread
        check()
    assert net.failure is None and not net.ready  # compiled, not yet taken over (the training thread does that)
    check()
    assert counters["stats"]["unique_graphs"] == 1 and runs == [1] and net.take_over() and net.version == 1
    check()
    assert counters["stats"]["unique_graphs"] == 1 and runs == [1, 1]  # the thread's graph serves this thread


def test_a_failed_background_compile_leaves_the_loss_uncompiled():
    from yolov9.train.loss import DetectionLoss

    def broken(gm, example_inputs):
        raise RuntimeError("no compiler here")

    torch._dynamo.reset()
    model = DetectionModel("gelan-t", nc=3).train()
    loss_fn = DetectionLoss.for_model(model)
    net = CompiledLoss(loss_fn, backend=broken, background=True)
    x, rows = torch.rand(2, 3, 64, 64), boxes_in_first_image(5, nc=3)
    net(model(x), rows)
    net.start_background()
    assert net.wait(timeout=120)
    assert not net.take_over() and "no compiler here" in net.failure
    torch.testing.assert_close(net(model(x), rows)[0], loss_fn(model(x), rows)[0])


def test_a_background_compile_hands_the_gil_back_sooner_while_it_runs():
    """The compiling thread runs with the short switch interval, so the training thread waits less for the GIL after
    each CUDA call and queue read; the interpreter's own interval comes back when the compile ends, failed or not."""
    from yolov9.train.loss import DetectionLoss

    seen = []

    def recording(gm, example_inputs):
        seen.append(sys.getswitchinterval())
        raise RuntimeError("recorded")

    torch._dynamo.reset()
    before = sys.getswitchinterval()
    assert before != SHORT_SWITCH_INTERVAL_S
    model = DetectionModel("gelan-t", nc=3).train()
    net = CompiledLoss(DetectionLoss.for_model(model), backend=recording, background=True)
    net(model(torch.rand(2, 3, 64, 64)), boxes_in_first_image(5, nc=3))
    net.start_background()
    assert net.wait(timeout=120) and "recorded" in net.failure
    assert seen == [pytest.approx(SHORT_SWITCH_INTERVAL_S)] and sys.getswitchinterval() == before


@pytest.mark.parametrize("cfg", ["gelan-t", "yolov9-t"])  # yolov9's layers read split views of earlier layers
def test_forward_compiled_in_the_background_serves_the_models_own_layers(request, cfg):
    """The forward's layers compile in a thread on a copy of the model while the model trains uncompiled; after the
    takeover the model's own compiled layers run what the thread compiled (dynamo's cache is per code object), with
    no compile on the training thread, and compute what the model computes. Its BatchNorm statistics are the run's
    alone: the copy's forward does not touch them."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = DetectionModel(cfg, nc=3).train()
    runs, backward_compiles = [], []  # calls of compiled forward graphs; backward graphs compiled

    def forward_graph(gm, example_inputs):
        return make_boxed_func(lambda *args: runs.append(1) or gm(*args))

    def backward_graph(gm, example_inputs):
        backward_compiles.append(1)
        return make_boxed_func(gm)

    counting = aot_autograd(fw_compiler=forward_graph, bw_compiler=backward_graph)
    net = CompiledForward(model, "layers", backend=counting, background=True)
    threads = torch.get_num_threads()
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    torch.set_num_threads(1 if threads > 1 else 2)
    x = torch.rand(2, 3, 64, 64)

    def check() -> None:
        stats = [b.clone() for b in model.buffers()]
        got = outputs(net(x))
        for b, s in zip(model.buffers(), stats, strict=True):  # the same forward through the model itself
            b.copy_(s)
        want = outputs(model(x))
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)

    check()
    assert not net.ready and counters["frames"]["total"] == 0 and not runs
    stats = [b.clone() for b in model.buffers()]
    net.start_background()
    assert net.wait(timeout=300) and net.failure is None and not net.ready  # not taken over by the thread itself
    for b, s in zip(model.buffers(), stats, strict=True):
        torch.testing.assert_close(b, s)  # the copy trained, not the model
    frames, compiled_backwards = counters["frames"]["total"], len(backward_compiles)
    assert frames > 0 and compiled_backwards > 0 and net.take_over() and net.version == 1
    runs.clear()
    check()
    assert counters["frames"]["total"] == frames and len(runs) == len(model.model)  # compiled, by the thread
    sum(t.sum() for t in outputs(net(x))).backward()
    assert len(backward_compiles) == compiled_backwards  # the backward too


def test_a_failed_background_compile_leaves_the_forward_uncompiled():
    def broken(gm, example_inputs):
        raise RuntimeError("no compiler here")

    torch._dynamo.reset()
    model = DetectionModel("gelan-t", nc=3).train()
    net = CompiledForward(model, "layers", backend=broken, background=True)
    x = torch.rand(2, 3, 64, 64)
    net(x)
    net.start_background()
    assert net.wait(timeout=120)
    assert not net.take_over() and "no compiler here" in net.failure
    model.eval()  # the same output without BatchNorm's statistics moving between the two calls
    torch.testing.assert_close(outputs(net(x))[0], outputs(model(x))[0])
