"""Training batches pinned a few ahead of the step (train/data/pinned.py): the loader's batches in order, its errors
raised where they are consumed, a stop that lets the workers go, and on a GPU pinned memory in a handful of blocks
where the loader's own pinning would allocate one per batch in flight."""

from __future__ import annotations

import itertools

import pytest
import torch

from yolov9.train.config import Hyp
from yolov9.train.data.dataset import Batch, DetectionDataset, EpochBatchSampler, run_batches, train_loader
from yolov9.train.data.formats import load_split, resolve_data
from yolov9.train.data.pinned import PinnedBatches, close_batches


def _batch(k: int) -> Batch:
    return Batch(torch.full((2, 3, 8, 8), k, dtype=torch.uint8), torch.full((1, 6), float(k)), torch.tensor([k, k]),
                 None)  # fmt: skip


def _dataset(coco48, n: int, img: int) -> DetectionDataset:
    ds = DetectionDataset(load_split(resolve_data(coco48), "train"), img, augment=Hyp())
    ds.images, ds.labels = ds.images[:n], ds.labels[:n]
    return ds


def test_batches_come_in_order_and_the_end_ends():
    out = PinnedBatches(iter([_batch(k) for k in range(5)]), torch.device("cpu"))
    assert [int(b.indices[0]) for b in out] == [0, 1, 2, 3, 4]
    assert next(out, None) is None  # and stays ended


def test_an_error_of_the_loader_is_raised_after_the_batches_before_it():
    def failing():
        yield _batch(0)
        raise ValueError("corrupt.jpg: not a JPEG")

    out = PinnedBatches(failing(), torch.device("cpu"))
    assert int(next(out).indices[0]) == 0
    for _ in range(2):  # and again, not a wait for a batch that never comes
        with pytest.raises(ValueError, match="corrupt.jpg"):
            next(out)


def test_a_pinning_thread_that_cannot_start_raises_in_the_training_thread():
    """A device the thread cannot select (no such GPU here, or no GPU at all) is an error at the first batch, not a
    wait for batches that never come."""
    out = PinnedBatches(iter([_batch(0)]), torch.device("cuda", 99))
    with pytest.raises(RuntimeError):
        next(out)


def test_close_stops_the_thread_and_the_loader_behind_it():
    stopped = []

    def endless():
        try:
            for k in itertools.count():
                yield _batch(k)
        finally:
            stopped.append(True)

    out = PinnedBatches(endless(), torch.device("cpu"), depth=2)
    next(out)
    out.close()  # the queue is full and the source has no end
    assert not out._thread.is_alive() and stopped == [True]


def test_run_batches_on_the_cpu_are_the_loaders_batches_unpinned(coco48):
    ds = _dataset(coco48, 6, 64)
    plain = list(train_loader(ds, EpochBatchSampler(len(ds), 4, epochs=2), workers=2))
    run = run_batches(train_loader(ds, EpochBatchSampler(len(ds), 4, epochs=2), workers=2), pin=torch.device("cpu"))
    got = list(run)
    assert len(got) == len(plain) == 4
    assert all(torch.equal(a.images, b.images) and not a.images.is_pinned() for a, b in zip(got, plain))
    close_batches(run)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (pinned memory is CUDA's)")
def test_on_the_gpu_batches_are_pinned_in_a_few_blocks(coco48):
    """On the trainer's default device ('cuda', no index), 12 batches while 4 workers keep up to 16 built ahead:
    pinned one by one, a handful of host blocks (the DataLoader's own pinning allocates a block per batch in
    flight)."""
    ds = _dataset(coco48, 48, 96)  # 96 px, batch 4: a block size no other test pins
    stats = getattr(torch.cuda, "host_memory_stats", None)
    before = stats().get("num_host_alloc", 0) if stats else 0  # the key appears with the first block
    run = run_batches(train_loader(ds, EpochBatchSampler(len(ds), 4, epochs=1), workers=4), pin=torch.device("cuda"))
    plain = list(train_loader(ds, EpochBatchSampler(len(ds), 4, epochs=1), workers=4))
    got = []
    for b in run:
        assert b.images.is_pinned() and b.rows.is_pinned()
        b.images.to("cuda", non_blocking=True)  # as the step copies it: the block is reused after the copy
        got.append((b.images.clone(), b.rows.clone()))  # unpinned copies; the pinned batch goes
        del b
    assert len(got) == len(plain) == 12
    assert all(torch.equal(x, b.images) and torch.equal(t, b.rows) for (x, t), b in zip(got, plain))
    if stats:  # images and targets of depth 2 + 1 being pinned + 1 in use + 1 being copied
        assert stats().get("num_host_alloc", 0) - before <= 2 * 5
