"""A background compile's second process (train/cache_fill.py): it rebuilds the part from its spec, compiles it as
the thread would, and hands back counts or a one-line reason; the thread compiles only after it, and nothing after a
failure or a stop. On the CPU the parts trace with dynamo's 'eager' backend (inductor's C++ compile of a model takes
minutes on two cores), with `fill_first` set as inductor sets it; the GPU test with inductor's caches is in
test_step.py."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import alive, boxes_in_first_image, outputs
from yolov9.core.model import DetectionModel
from yolov9.train.cache_fill import tensor_like, tensor_meta
from yolov9.train.compiled import CompiledForward, CompiledLoss
from yolov9.train.loss import DetectionLoss


def _filling(part):
    part.fill_first = True  # as with inductor
    return part


def test_a_tensors_meta_rebuilds_its_shape_strides_and_dtype():
    x = torch.rand(2, 3, 8, 8).contiguous(memory_format=torch.channels_last).half()
    y = tensor_like(tensor_meta(x), torch.device("cpu"))
    assert (y.shape, y.stride(), y.dtype) == (x.shape, x.stride(), x.dtype) and torch.isfinite(y).all()
    with pytest.raises(ValueError, match="not a torch dtype"):
        tensor_like({**tensor_meta(x), "dtype": "Tensor"}, torch.device("cpu"))


def test_a_parts_spec_rebuilds_the_same_model_input_and_loss():
    """What the second process compiles is what the thread would: the same layers and parameter layouts, the same
    input's shape, strides, dtype and autocast, and a loss that computes the same values."""
    model = DetectionModel("yolov9-t", nc=3).train().to(memory_format=torch.channels_last)
    net = CompiledForward(model, "layers", backend="eager", background=True)
    x = torch.rand(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    with torch.autocast("cpu", torch.bfloat16):
        preds = net(x)
    twin = CompiledForward.from_cache_spec(net.cache_spec(), torch.device("cpu"))
    theirs, ours = dict(twin.model.named_parameters()), dict(model.named_parameters())
    assert theirs.keys() == ours.keys()
    assert all((theirs[k].shape, theirs[k].stride()) == (p.shape, p.stride()) for k, p in ours.items())
    (tx, tamp), (ox, oamp) = twin._example, net._example
    assert (tx.shape, tx.stride(), tx.dtype) == (ox.shape, ox.stride(), ox.dtype)
    assert tamp == oamp == (True, torch.bfloat16, True)

    loss_fn = DetectionLoss.for_model(model)
    loss = CompiledLoss(loss_fn, backend="eager", background=True)
    loss(preds, boxes_in_first_image(4, nc=3))
    twin_loss = CompiledLoss.from_cache_spec(loss.cache_spec(), torch.device("cpu"))
    (theads, tgt), (oheads, ogt) = twin_loss._example, loss._example
    assert [[(f.shape, f.stride(), f.dtype) for f in h] for h in theads] == [
        [(f.shape, f.stride(), f.dtype) for f in h] for h in oheads
    ]
    torch.testing.assert_close(tgt, ogt)
    for a, b in zip(twin_loss.loss(oheads, ogt), loss_fn(oheads, ogt), strict=True):
        torch.testing.assert_close(a, b)


def test_the_forward_compiles_in_a_second_process_then_in_the_thread():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = DetectionModel("gelan-t", nc=3).train()
    net = _filling(CompiledForward(model, "layers", backend="eager", background=True))
    assert net.filled is None
    x = torch.rand(2, 3, 64, 64)
    net(x)  # the first call starts the second process
    assert net.fill is not None and counters["frames"]["total"] == 0
    net.start_background()
    assert net.wait(timeout=300) and net.failure is None
    assert net.fill.report["graphs"] == len(model.model) and net.filled  # every layer, compiled there
    assert counters["frames"]["total"] > 0 and net.take_over()  # then here
    model.eval()
    torch.testing.assert_close(outputs(net(x))[0], outputs(model(x))[0])


def test_the_loss_compiles_in_a_second_process_then_in_the_thread():
    model = DetectionModel("gelan-t", nc=3).train()
    loss_fn = DetectionLoss.for_model(model)
    net = _filling(CompiledLoss(loss_fn, backend="eager", background=True))
    preds = model(torch.rand(2, 3, 64, 64))
    rows = boxes_in_first_image(5, nc=3)
    net(preds, rows)
    net.start_background()
    assert net.wait(timeout=300) and net.failure is None and net.fill.report["graphs"] == 1 and net.take_over()
    torch.testing.assert_close(net(preds, rows)[0], loss_fn(preds, rows)[0])


def test_a_compile_that_fails_in_the_second_process_leaves_the_part_uncompiled_with_the_reason():
    """What failed there would fail in the thread as well: the thread does not try, and the run goes on eagerly."""
    model = DetectionModel("gelan-t", nc=3).train()
    model.cfg = {**model.cfg, "backbone": [[-1, 1, "NoSuchBlock", [16]]]}  # what the second process rebuilds
    net = _filling(CompiledForward(model, "layers", backend="eager", background=True))
    x = torch.rand(2, 3, 64, 64)
    net(x)
    net.start_background()
    assert net.wait(timeout=300) and not net.take_over()
    assert net.failure.startswith("in a second process: ") and "NoSuchBlock" in net.failure
    assert "\n" not in net.failure
    model.eval()
    torch.testing.assert_close(outputs(net(x))[0], outputs(model(x))[0])


def test_with_too_little_gpu_memory_for_the_threads_copy_the_training_thread_compiles_at_the_takeover():
    """The thread's copy would not fit beside the run (`_memory_short`, made to say so here; on a GPU the forward's
    copy needs about the run's peak): the thread compiles nothing and says why, and the next call, on the training
    thread, compiles. The loss stands in for the forward: the rule is BackgroundCompile's, and the loss is one
    graph, the forward dozens."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = DetectionModel("gelan-t", nc=3).train()
    loss_fn = DetectionLoss.for_model(model)
    net = CompiledLoss(loss_fn, backend="eager", background=True)
    net._memory_short = lambda device: "1.0 GiB of GPU memory free, about 9.0 GiB needed beside the run"
    preds = model(torch.rand(2, 3, 64, 64))
    rows = boxes_in_first_image(5, nc=3)
    net(preds, rows)
    net.start_background()
    assert net.wait(timeout=60) and net.failure is None and "9.0 GiB needed" in net.notice
    assert counters["stats"]["unique_graphs"] == 0 and net._example is None
    assert net.take_over()
    got = net(preds, rows)[0]
    assert counters["stats"]["unique_graphs"] == 1  # compiled here, at the first call after the takeover
    torch.testing.assert_close(got, loss_fn(preds, rows)[0])


def test_a_stopped_compile_ends_its_process_and_the_thread_compiles_nothing():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = DetectionModel("gelan-t", nc=3).train()
    net = _filling(CompiledForward(model, "layers", backend="eager", background=True))
    net(torch.rand(2, 3, 64, 64))
    fill = net.fill
    net.stop()  # the run ended
    assert not fill.running() and not fill._dir.exists()
    net.start_background()
    assert net.wait(timeout=60) and not net.take_over() and "stopped" in net.failure
    assert counters["frames"]["total"] == 0


def test_with_inductor_the_thread_finds_what_the_second_process_compiled_in_the_cache(monkeypatch, tmp_path):
    """Inductor's own compile (C++ on the CPU): the second process compiles the loss into an empty cache (misses);
    the thread's compile of the same loss then misses nothing, and the compiled loss computes the loss. The training
    process runs with a matmul precision other than the default, which inductor's cache keys read: the second
    process takes it over (the GPU test's full-fp32 settings made every lookup miss before it did)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    matmul = torch.backends.cuda.matmul
    before, matmul.fp32_precision = matmul.fp32_precision, "ieee"
    try:
        _compile_the_loss_in_both()
    finally:
        matmul.fp32_precision = before


def _compile_the_loss_in_both() -> None:
    from torch._dynamo.utils import counters

    from yolov9.train.compiled import cache_counts

    torch._dynamo.reset()
    counters.clear()
    model = DetectionModel("gelan-t", nc=3).train()
    loss_fn = DetectionLoss.for_model(model)
    net = CompiledLoss(loss_fn, background=True)
    assert net.fill_first  # inductor's path
    preds = model(torch.rand(2, 3, 64, 64))
    rows = boxes_in_first_image(5, nc=3)
    net(preds, rows)
    net.start_background()
    assert net.wait(timeout=900) and net.failure is None, net.failure
    assert net.fill.report["compile_cache_misses"] > 0
    counts = cache_counts()
    assert counts["compile_cache_misses"] == 0 and counts["compile_cache_hits"] > 0, counts
    assert net.take_over()
    torch.testing.assert_close(net(preds, rows)[0], loss_fn(preds, rows)[0], rtol=1e-4, atol=1e-4)
    # compiled on this machine before (`cached`): no second process, the thread takes every graph from the cache
    torch._dynamo.reset()
    counters.clear()
    again = CompiledLoss(loss_fn, background=True, cached=True)
    assert not again.fill_first
    again(preds, rows)
    again.start_background()
    assert again.wait(timeout=900) and again.failure is None and again.fill is None, again.failure
    counts = cache_counts()
    assert counts["compile_cache_misses"] == 0 and counts["compile_cache_hits"] > 0, counts
    assert again.take_over()
    torch.testing.assert_close(again(preds, rows)[0], loss_fn(preds, rows)[0], rtol=1e-4, atol=1e-4)


_ORPHANING_PARENT = """
import os, sys, torch
from yolov9.core.model import DetectionModel
from yolov9.train.compiled import CompiledForward
net = CompiledForward(DetectionModel("yolov9-c", nc=3).train(), "layers", backend="eager", background=True)
net.fill_first = True
net(torch.rand(1, 3, 64, 64))
print(net.fill.proc.pid, flush=True)
os._exit(0)  # killed, as it were: nothing stops the compile
"""


def test_the_second_process_ends_when_the_training_process_dies_without_stopping_it():
    import subprocess
    import sys
    import time

    out = subprocess.run([sys.executable, "-c", _ORPHANING_PARENT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 20  # its own compile would run on for 30-40 s (measured on two cores)
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(pid)
