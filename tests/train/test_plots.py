"""The pictures drawn during training: on a thread of their own on a GPU, and a failed one named, not fatal."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from yolov9.train import plots


def _labels() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [np.c_[rng.integers(0, 3, (4, 1)), rng.uniform(0.1, 0.9, (4, 4))].astype(np.float32) for _ in range(8)]


@pytest.mark.parametrize("background", [True, False])
def test_pictures_are_drawn_and_a_failure_is_named(tmp_path, background):
    threads = []

    def labels(*args):
        threads.append(threading.current_thread())
        return plots.plot_labels(*args)

    def broken(out: Path) -> Path:
        raise ValueError("no pixels")

    images = torch.randint(0, 255, (2, 3, 64, 64), dtype=torch.uint8)
    boxes = [torch.tensor([[1, 4.0, 4.0, 40.0, 40.0]]), torch.zeros((0, 5))]
    drawn = plots.BackgroundPlots(background=background)
    drawn.submit(labels, _labels(), ["a", "b", "c"], out=tmp_path / "labels.jpg")
    drawn.submit(broken, out=tmp_path / "broken.jpg")
    drawn.submit(plots.plot_batch, images, boxes, ["a", "b"], out=tmp_path / "batch.jpg")
    assert drawn.close() == ["broken.jpg: no pixels"]
    assert Image.open(tmp_path / "labels.jpg").size == (1000, 1000)
    assert Image.open(tmp_path / "batch.jpg").size == (128, 64)
    assert (threads[0] is threading.main_thread()) is not background
