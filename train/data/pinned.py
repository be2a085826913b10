"""Training batches pinned a few at a time, just ahead of the step.

A DataLoader with `pin_memory=True` pins every batch its workers have built, up to `prefetch_factor x workers` of
them, and each new pinned block is a `cudaHostAlloc` that holds the CUDA driver's lock while the training thread
launches kernels (pytorch/pytorch#97432). At a run's start that is dozens of blocks of a batch's size beside the
warm-up and the first steps. Here the workers still build as far ahead as they like, in their shared memory, but a
thread pins only `depth` batches ahead of the step, so the host allocator's cache needs a handful of blocks."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import torch

_END = object()


class PinnedBatches:
    """Iterates `batches` (Batch tuples) with their images and target rows in pinned memory; `close()` stops the thread
    and lets the loader's workers go."""

    def __init__(self, batches: Iterator, device: torch.device, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._batches = batches
        self._ended = None  # StopIteration or the loader's error, raised again by every later next()
        if device.type == "cuda" and device.index is None:  # 'cuda' is the caller's current GPU, not the thread's
            device = torch.device("cuda", torch.cuda.current_device())
        self._thread = threading.Thread(target=self._pin, args=(device,), name="pin-batches", daemon=True)
        self._thread.start()

    def _pin(self, device: torch.device) -> None:
        cuda = device.type == "cuda"  # on the CPU the batches pass through as they are
        try:
            if cuda:
                torch.cuda.set_device(device)  # the pinned blocks belong to the training GPU's context
            for batch in self._batches:
                if cuda:
                    batch = batch._replace(images=batch.images.pin_memory(), rows=batch.rows.pin_memory())
                if not self._put(batch):
                    return
            self._put(_END)
        except BaseException as e:  # raised again in the training thread, as the loader would have raised it
            self._put(e)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> PinnedBatches:
        return self

    def __next__(self):
        if self._ended is not None:
            raise self._ended
        item = self._queue.get()
        if item is _END or isinstance(item, BaseException):
            self._ended = StopIteration() if item is _END else item
            raise self._ended
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)  # it may be waiting for a worker's batch
        if not self._thread.is_alive():  # else it still iterates them: the process's exit ends both
            close_batches(self._batches)


def close_batches(batches: Iterator) -> None:
    """Stops a batch iterator that can be stopped (a generator, PinnedBatches): its loader's workers go with it."""
    close = getattr(batches, "close", None)
    if close is not None:
        close()
