"""The training step skips non-finite steps on the device (fused optimizer, found_inf) and otherwise steps exactly
as the reference optimizer does; on a GPU the whole step runs without one host synchronisation."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.conftest import outputs, rows_per_image
from yolov9.train.ema import ModelEMA
from yolov9.train.step import (
    AUTO_CUDNN_BENCHMARK_IMAGES,
    StepOptions,
    build_optimizer,
    cudnn_benchmark,
    forward_backward,
    heuristic_convolutions,
    load_optimizer_state,
    make_scaler,
    optimizer_step,
)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.SiLU(), nn.Conv2d(8, 4, 1))


def _imgs() -> torch.Tensor:
    return torch.randint(0, 256, (2, 3, 12, 12), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))


def _loss(poison: bool = False):
    def fn(preds, targets):
        loss = preds.float().square().mean() * (torch.nan if poison else 1.0)
        return loss, loss.detach().repeat(3)

    return fn


def _step(model, opt, scaler, ema=None, poison=False) -> torch.Tensor:
    forward_backward(model, _imgs(), torch.zeros(0, 6), _loss(poison), scaler)
    return optimizer_step(model, opt, scaler, ema, 10.0)


def _reference(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Plain (unfused) SGD over the same three groups."""
    fused = build_optimizer(model, "SGD", lr, 0.937, 5e-4)
    groups = [{k: v for k, v in g.items() if k != "fused"} for g in fused.param_groups]
    return torch.optim.SGD(groups, lr=lr, momentum=0.937, nesterov=True, foreach=False)


def test_fused_step_equals_plain_sgd():
    a, b = _net(), _net()
    opt_a, opt_b = build_optimizer(a, "SGD", 0.05, 0.937, 5e-4), _reference(b, 0.05)
    for _ in range(3):
        assert float(_step(a, opt_a, make_scaler(torch.device("cpu"), None))) == 0.0
        forward_backward(b, _imgs(), torch.zeros(0, 6), _loss(), make_scaler(torch.device("cpu"), None))
        nn.utils.clip_grad_norm_(b.parameters(), 10.0)
        opt_b.step()
        opt_b.zero_grad()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["SGD", "AdamW"])
@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "grad-scaler"])
def test_nonfinite_loss_skips_even_the_first_step_and_changes_nothing(optimizer, scaled):
    model, fresh = _net(), _net()
    opt = build_optimizer(model, optimizer, 0.05, 0.9, 5e-4)
    scaler = torch.amp.GradScaler("cpu", enabled=scaled)
    ema = ModelEMA(model)
    before = copy.deepcopy(dict(model.named_parameters()))  # (a forward still moves BatchNorm's running stats)
    assert float(_step(model, opt, scaler, ema, poison=True)) == 1.0
    for k, v in model.named_parameters():
        assert torch.equal(v, before[k]), k
    if optimizer == "SGD":
        assert all(torch.count_nonzero(s["momentum_buffer"]) == 0 for s in opt.state.values())
    assert ema.updates == 1
    if scaled:
        assert scaler.get_scale() == 2.0**15  # backed off from 2**16, as after an fp16 overflow
    # the next, finite step is the first step a fresh optimizer would take
    ref_opt = build_optimizer(fresh, optimizer, 0.05, 0.9, 5e-4)
    ref_scaler = torch.amp.GradScaler("cpu", enabled=scaled, init_scale=scaler.get_scale())
    assert float(_step(model, opt, scaler)) == 0.0 == float(_step(fresh, ref_opt, ref_scaler))
    for pa, pb in zip(model.parameters(), fresh.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)
    assert any(not torch.equal(v, before[k]) for k, v in model.named_parameters())


def test_state_of_an_unfused_optimizer_resumes_fused():
    model = _net()
    plain = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    forward_backward(model, _imgs(), torch.zeros(0, 6), _loss(), make_scaler(torch.device("cpu"), None))
    plain.step()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    load_optimizer_state(opt, plain.state_dict())
    assert all(g["fused"] for g in opt.param_groups) and len(opt.state) == len(plain.state)
    assert float(_step(model, opt, make_scaler(torch.device("cpu"), None), poison=True)) == 1.0


def test_step_needs_a_fused_optimizer():
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    forward_backward(model, _imgs(), torch.zeros(0, 6), _loss(), make_scaler(torch.device("cpu"), None))
    with pytest.raises(ValueError, match="fused optimizer"):
        optimizer_step(model, opt, make_scaler(torch.device("cpu"), None), None, 10.0)


def _gpu_setup(amp):
    from yolov9.core.model import DetectionModel
    from yolov9.train.loss import DetectionLoss

    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = DetectionModel("gelan-t", nc=3).to(dev).train()
    return model, DetectionLoss.for_model(model), make_scaler(dev, amp)


def _gpu_batch(i: int, boxes: int = 1, b: int = 4, img: int = 128):
    g = torch.Generator().manual_seed(i)
    imgs = torch.randint(0, 256, (b, 3, img, img), dtype=torch.uint8, generator=g).pin_memory()
    return imgs, rows_per_image(b, boxes, 3, g).pin_memory()


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
@pytest.mark.parametrize("amp", [torch.float16, torch.bfloat16])
def test_training_step_never_waits_for_the_host_on_a_gpu(amp):
    from yolov9.train.graphed_step import GraphedStep

    model, loss_fn, scaler = _gpu_setup(amp)
    opt, ema = build_optimizer(model, "SGD", 0.01, 0.937, 5e-4), ModelEMA(model)
    graphed = GraphedStep(model, loss_fn, scaler, StepOptions(amp), warmup=2)
    imgs, targets = _gpu_batch(0)
    # eager steps: the first allocates, picks kernels and caches the loss constants; the later ones must not sync
    for i in range(3):
        torch.cuda.set_sync_debug_mode("error" if i else "default")
        try:
            forward_backward(model, imgs, targets, loss_fn, scaler, StepOptions(amp))
            optimizer_step(model, opt, scaler, ema, 10.0, keep_grads=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for i in range(6):  # graphed: two warm-up steps and the capture may synchronise, the replays must not
        torch.cuda.set_sync_debug_mode("error" if i > 2 else "default")
        try:
            graphed(imgs, targets)
            skipped = optimizer_step(model, opt, scaler, ema, 10.0, keep_grads=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert graphed.captures == 1 and float(skipped) in (0.0, 1.0)


@pytest.fixture
def deterministic_cudnn():
    """Deterministic cuDNN and full fp32 (no TF32): two computations of one step may differ in rounding only."""
    flags = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = flags[0].benchmark, flags[0].deterministic, flags[0].allow_tf32, flags[1].allow_tf32
    flags[0].benchmark, flags[0].deterministic, flags[0].allow_tf32, flags[1].allow_tf32 = False, True, False, False
    yield
    flags[0].benchmark, flags[0].deterministic, flags[0].allow_tf32, flags[1].allow_tf32 = saved


@needs_cuda
def test_graphed_step_trains_like_the_eager_step(deterministic_cudnn):
    from yolov9.train.graphed_step import GraphedStep

    eager, loss_fn, scaler = _gpu_setup(None)
    graph_model = copy.deepcopy(eager)
    opts = [build_optimizer(m, "SGD", 0.01, 0.937, 5e-4) for m in (eager, graph_model)]
    graphed = GraphedStep(graph_model, loss_fn, make_scaler(torch.device("cuda"), None), warmup=2)
    # box counts grow past the captured buffer once (two warm-up steps, a second capture); the last batch is short
    # (eager)
    plan = [(1, 4), (2, 4), (3, 4), (1, 4), (90, 4), (5, 4), (4, 4), (2, 3)]
    for i, (boxes, b) in enumerate(plan):
        imgs, targets = _gpu_batch(i, boxes, b)
        _, want = forward_backward(eager, imgs, targets, loss_fn, scaler)
        _, got = graphed(imgs, targets)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for m, o in zip((eager, graph_model), opts):
            optimizer_step(m, o, scaler, None, 10.0, keep_grads=True)
    assert graphed.captures == 2
    for pa, pb in zip(eager.parameters(), graph_model.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-5)


def _pool_bytes(pool: tuple[int, int]) -> int:
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot() if seg["segment_pool_id"] == pool)


@needs_cuda
def test_a_dropped_graph_hands_its_memory_back_before_the_next_warm_up():
    """More boxes than the buffer holds drop the graph: its pool is freed before the warm-up step that follows
    allocates its own activations, not left beside them until an allocation fails."""
    from yolov9.train.graphed_step import GraphedStep

    model, loss_fn, scaler = _gpu_setup(None)
    graphed = GraphedStep(model, loss_fn, scaler, warmup=1)
    for i in range(2):
        graphed(*_gpu_batch(i, 2, 16, 256))
    assert graphed.captures == 1
    pool = tuple(graphed.graph.pool())
    held = _pool_bytes(pool)
    graphed(*_gpu_batch(2, 90, 16, 256))  # 1,440 rows: a larger buffer and an eager warm-up step
    left = _pool_bytes(pool)
    assert graphed.graph is None and held > 0 and left <= held // 10, f"{held} bytes in the pool, then {left}"


@needs_cuda
def test_more_boxes_during_a_background_compile_run_eagerly_and_keep_the_graph(deterministic_cudnn):
    """While COMPILE_LOCK is held (a background compile) no capture can run: a batch with more boxes than the
    captured buffer runs eagerly, the next one that fits replays the graph, and the new capacity is captured once
    the lock is free. Every batch matches eager."""
    from yolov9.train.compiled import COMPILE_LOCK
    from yolov9.train.graphed_step import GraphedStep

    eager, loss_fn, scaler = _gpu_setup(None)
    graph_model = copy.deepcopy(eager)
    graphed = GraphedStep(graph_model, loss_fn, scaler, warmup=1)
    # boxes, whether the lock is held, captures after the batch
    plan = [(2, False, 0), (2, False, 1), (90, True, 1), (3, True, 1), (90, False, 1), (90, False, 2), (4, False, 2)]
    for i, (boxes, locked, captures) in enumerate(plan):
        imgs, targets = _gpu_batch(i, boxes)
        if locked:
            COMPILE_LOCK.acquire()
        try:
            _, got = graphed(imgs, targets)
            kept = graphed.targets.shape[0]
        finally:
            if locked:
                COMPILE_LOCK.release()
        _, want = forward_backward(eager, imgs, targets, loss_fn, scaler)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert graphed.captures == captures, f"batch {i}"
        assert kept == (64 if i < 4 else 512), f"batch {i}: the buffer holds {kept} boxes"  # 8 and 360 rows
    for pa, pb in zip(eager.parameters(), graph_model.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-5)


class _Batches(torch.utils.data.Dataset):
    """Whole batches of random uint8 images and their target rows, `boxes[i]` per image in batch i (seeded by
    offset + i); the last is short if `short_last`. Served by a loader with workers and pinned memory, as in
    training: its pin thread works while the main thread captures."""

    def __init__(self, batch: int, boxes: list[int], offset: int = 0, short_last: bool = True, img: int = 96):
        self.batch, self.boxes, self.offset, self.short_last, self.img = batch, boxes, offset, short_last, img

    def __len__(self) -> int:
        return len(self.boxes)

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.offset + i)
        b = max(1, self.batch // 2) if self.short_last and i == len(self.boxes) - 1 else self.batch
        imgs = torch.randint(0, 256, (b, 3, self.img, self.img), dtype=torch.uint8, generator=g)
        return imgs, rows_per_image(b, self.boxes[i], 3, g)


def _train_steps(
    cfg: str, amp, graphs: bool, data: _Batches, start: dict | None = None, lr_drop_at: int = 4, compile: str = "off"
):
    """Micro-batches from a pinning loader, an optimizer step every second one, the LR halved at global batch
    `lr_drop_at` (as the schedule changes it); returns the losses, the model, the EMA, the step and the state a
    checkpoint would save."""
    from yolov9.core.model import DetectionModel
    from yolov9.train.compiled import compiled
    from yolov9.train.engine import TrainStep
    from yolov9.train.loss import DetectionLoss

    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = DetectionModel(cfg, nc=3).to(dev).train().to(memory_format=torch.channels_last)
    opt = build_optimizer(model, "SGD", 0.01, 0.937, 5e-4)
    scaler, ema = make_scaler(dev, amp), ModelEMA(model)
    if start is not None:
        model.load_state_dict(start["model"])
        load_optimizer_state(opt, start["optimizer"])
        scaler.load_state_dict(start["scaler"])
        ema.load_state_dict(start["ema"])
    opts = StepOptions(amp, cuda_graph=graphs, compile=compile)
    net = compiled(model, compile)
    step = TrainStep(model, net, DetectionLoss.for_model(model), opt, scaler, ema, opts)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, pin_memory=True)
    losses = []
    for i, (imgs, targets) in enumerate(loader):
        if data.offset + i == lr_drop_at:
            for g in opt.param_groups:
                g["lr"] *= 0.5
        losses.append(step.micro(imgs, targets)[1].clone())
        if (data.offset + i + 1) % 2 == 0:
            step.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict()}
    state["ema"] = ema.state_dict()
    return torch.stack(losses), model, ema, step, copy.deepcopy(state)


# boxes per image in each batch: a few (the first buffer's rows), none, more rows than that buffer holds (a second
# buffer and capture, after three warm-up steps), fewer again (replayed on the larger buffer), and a short last batch
_PLAN = [3, 3, 0, 3, 300, 300, 2, 3, 1]


@needs_cuda
@pytest.mark.parametrize("cfg", ["gelan-t", "yolov9-t"])
@pytest.mark.parametrize("batch", [8, 16, 64, 128])
def test_captured_step_trains_like_the_eager_step_beside_a_pinning_loader(cfg, batch, deterministic_cudnn):
    want, eager, eager_ema, _, _ = _train_steps(cfg, None, False, _Batches(batch, _PLAN))
    got, graphed, graphed_ema, step, _ = _train_steps(cfg, None, True, _Batches(batch, _PLAN))
    assert step.graphed.captures == 2 and step.graphed_opt.captures == 1  # 300 boxes re-capture; LR needs none
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for a, b in zip(graphed.state_dict().values(), eager.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(graphed_ema.ema.state_dict().values(), eager_ema.ema.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert graphed_ema.updates == eager_ema.updates == len(_PLAN) // 2


@needs_cuda
@pytest.mark.parametrize("amp", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_captured_step_resumes_exactly(amp, deterministic_cudnn):
    """Ten graphed batches equal six, saved, loaded into a new model, optimizer, scaler and EMA, and four more
    (the continuation captures afresh)."""
    plan = [3, 3, 0, 5, 300, 2, 7, 1, 4, 6]
    full, *_ = _train_steps("gelan-t", amp, True, _Batches(16, plan, short_last=False))
    first, *_, state = _train_steps("gelan-t", amp, True, _Batches(16, plan[:6], short_last=False))
    rest, *_ = _train_steps("gelan-t", amp, True, _Batches(16, plan[6:], offset=6, short_last=False), start=state)
    assert torch.isfinite(full).all()
    torch.testing.assert_close(torch.cat((first, rest)), full, rtol=1e-4, atol=1e-5)


def _layer_gradients(model: nn.Module) -> dict[int, torch.Tensor]:
    """Each layer's gradients as one vector, by layer index (`model.{i}.`)."""
    grads: dict[int, list[torch.Tensor]] = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            grads.setdefault(int(name.split(".")[1]), []).append(p.grad.flatten())
    return {i: torch.cat(g) for i, g in grads.items()}


@needs_cuda
@pytest.mark.parametrize("mode", ["loss", "layers", "model"])
def test_compiled_captured_micro_batch_matches_eager_at_the_same_weights(mode, deterministic_cudnn):
    """Inductor's kernels inside the captured micro-batch give eager's losses and gradients batch by batch, at fixed
    weights (over a run of optimizer steps the two drift apart as any two reduction orders do: 0.8-1.6% in the loss
    after 8 steps, measured), with a re-capture for more boxes and a short last batch (which runs uncompiled).
    Gradients are compared per layer by direction and size: at random weights the assigner's top-k meets near
    ties, so rounding alone moves single entries (a compiled loss against the eager one: 2e-3 in the first
    layer's weight gradient, measured); a lost gradient path shows as a layer pointing elsewhere or vanishing."""
    step = _compare_micro_batches(StepOptions(compile=mode))
    assert step.graphed.captures == 2


@needs_cuda
def test_loss_compiled_in_the_background_takes_over_the_captured_step(deterministic_cudnn):
    """--compile-background: the first capture holds the uncompiled loss; the compile starts after it, the
    captured step waits for it to capture again (here the test waits for the compile after the fourth batch),
    and every batch, before and after, matches eager."""
    step = _compare_micro_batches(StepOptions(compile="loss", compile_background=True), wait_after=3)
    assert step.loss_fn.failure is None and step.loss_fn.ready and step.loss_fn.version == 1
    assert step.graphed.captures == 2  # the uncompiled loss's, then the compiled one's (with room for 300 boxes)


@needs_cuda
def test_forward_compiled_in_the_background_takes_over_the_captured_step(deterministic_cudnn):
    """--compile layers --compile-background: the layers and the loss compile in threads (one after the other)
    after the first capture; both take over at the same step and the step is captured once more, and every batch
    matches eager."""
    step = _compare_micro_batches(StepOptions(compile="layers", compile_background=True), wait_after=3)
    assert [p.failure for p in step.background] == [None, None]
    assert step.net.ready and step.loss_fn.ready and step.graphed.captures == 2


@needs_cuda
def test_a_background_compile_fills_inductors_caches_in_a_second_process_first(
    monkeypatch, tmp_path, deterministic_cudnn
):
    """With inductor, a part compiles first in a second process, into an empty cache; the thread's compile then
    finds every graph in inductor's caches (no misses in this process, under this test's full-fp32 matmul settings,
    which the second process takes over), and the batches match eager throughout. The loss stands in for both parts
    (the forward's layers took 287 s to compile cold here; whole runs show them found in the cache the same way,
    docs/benchmarks.md, fiftieth session)."""
    from torch._dynamo.utils import counters

    from yolov9.train.compiled import cache_counts

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()  # the loss compiled by earlier tests would otherwise run from dynamo's own cache, unlooked-up
    counters.clear()
    step = _compare_micro_batches(StepOptions(compile="loss", compile_background=True), wait_after=3)
    assert step.loss_fn.failure is None and step.loss_fn.ready
    report = step.loss_fn.fill.report
    assert report is not None and report["compile_cache_misses"] > 0, report
    counts = cache_counts()
    assert counts["compile_cache_misses"] == 0 and counts["compile_cache_hits"] > 0, counts


@needs_cuda
def test_a_background_compile_of_the_layers_holds_a_fraction_of_a_steps_memory_beside_the_run():
    """The thread compiles the layers one at a time, forward then backward, so beside the run it holds about one
    layer's activations (and the outputs later layers read), not a second step's (measured on the CPU from what
    autograd saves: 18-19% of a forward's for gelan-t and yolov9-s)."""
    from yolov9.core.model import DetectionModel
    from yolov9.train.compiled import CompiledForward

    dev = torch.device("cuda")
    torch._dynamo.reset()
    model = DetectionModel("gelan-t", nc=3).to(dev).train().to(memory_format=torch.channels_last)
    net = CompiledForward(model, "layers", backend="aot_eager", background=True)
    x = torch.rand(32, 3, 320, 320, device=dev)

    def peak_of(work) -> int:
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        work()
        torch.cuda.synchronize(dev)
        return torch.cuda.max_memory_allocated(dev) - base

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.float16):
            out = net(x)  # uncompiled; keeps a copy of its input for the thread
        sum(t.float().sum() for t in outputs(out)).backward()

    def background() -> None:
        net.start_background()
        assert net.wait(timeout=300) and net.failure is None

    step()  # the gradients' memory, allocated once
    step_bytes, thread_bytes = peak_of(step), peak_of(background)
    assert 0 < thread_bytes < step_bytes / 2, (thread_bytes, step_bytes)
    assert net.take_over()


def _compare_micro_batches(opts: StepOptions, wait_after: int | None = None):
    """The step's micro-batches against eager ones at the same weights (see the test above); returns the step."""
    from yolov9.core.model import DetectionModel
    from yolov9.train.compiled import compiled
    from yolov9.train.engine import TrainStep
    from yolov9.train.loss import DetectionLoss

    dev = torch.device("cuda")
    torch.manual_seed(0)
    eager = DetectionModel("gelan-t", nc=3).to(dev).train().to(memory_format=torch.channels_last)
    model = copy.deepcopy(eager)
    scaler, loss_fn = make_scaler(dev, None), DetectionLoss.for_model(eager)
    opt = build_optimizer(model, "SGD", 0.01, 0.937, 5e-4)
    step = TrainStep(model, compiled(model, opts.compile, opts.compile_background), loss_fn, opt, scaler, None, opts)
    step.graphed_opt = None  # micro-batches only: no optimizer step to capture before a background compile starts
    data = _Batches(16, _PLAN)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, pin_memory=True)
    for i, (imgs, targets) in enumerate(loader):
        _, want = forward_backward(eager, imgs, targets, loss_fn, scaler)
        _, got = step.micro(imgs, targets)
        if i == wait_after:
            for part in step.background:
                assert part.wait(timeout=600), "the background compile did not finish in 10 minutes"
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)
        wants, gots = _layer_gradients(eager), _layer_gradients(model)
        assert wants.keys() == gots.keys()
        for layer, w in wants.items():
            cos = float(torch.nn.functional.cosine_similarity(gots[layer], w, dim=0))
            ratio = float(gots[layer].norm() / w.norm().clamp_min(1e-12))
            why = f"batch {i}, layer {layer}: cosine {cos:.4f}, norm ratio {ratio:.3f}"
            assert cos > 0.99 and 0.95 < ratio < 1.05, why
        for p in (*model.parameters(), *eager.parameters()):
            if p.grad is not None:
                p.grad.zero_()
    return step


def test_cudnn_times_its_algorithms_by_default_only_in_a_run_long_enough_to_earn_it_back():
    from yolov9.cli import build_parser
    from yolov9.train.cli import _config

    def chosen(*flags: str) -> bool | None:
        return _config(build_parser().parse_args(["train", *flags])).cudnn_benchmark

    assert chosen() is None
    assert cudnn_benchmark(chosen(), AUTO_CUDNN_BENCHMARK_IMAGES) is True
    assert cudnn_benchmark(chosen(), AUTO_CUDNN_BENCHMARK_IMAGES - 1) is False
    assert cudnn_benchmark(chosen("--cudnn-benchmark"), 1) is True
    assert cudnn_benchmark(chosen("--no-cudnn-benchmark"), 10**9) is False


def test_heuristic_convolutions_turn_cudnns_timing_off_inside_and_back_after_a_failure():
    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        with pytest.raises(RuntimeError, match="val failed"), heuristic_convolutions():
            assert torch.backends.cudnn.benchmark is False
            raise RuntimeError("val failed")
        assert torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = before
