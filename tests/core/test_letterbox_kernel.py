"""The one-kernel letterbox (core/letterbox_kernel.py) against the per-size reference path of prepare_batch: on the
CPU through Triton's interpreter (in a child process: the interpreter is chosen when the kernel is defined), on a
GPU compiled."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from tests.conftest import requires_cuda

# sizes that exercise the arithmetic: shrink, exact fit, upscale, tall and wide slivers (one a single row that
# shrinks to one), a single pixel, repeats
_COMPARE = """
import sys, torch
from yolov9.core.decode import decode_image
from yolov9.core.letterbox_kernel import letterbox_batch
from yolov9.core.paths import sample_images
from yolov9.core.preprocess import prepare_batch

size, device = int(sys.argv[1]), sys.argv[2]
shipped = [decode_image(f) for f in sorted(sample_images())]
im = shipped[0]
images = shipped + [im[:, :size, :size], im[:, :40, :30], im[:, :, :9], im[:, :7, :], im[:, :1, :], im[:, :1, :1]]
images.append(shipped[0])
images = [x.contiguous().to(device) for x in images]
rows = len(images) + 2
out, placed = letterbox_batch(images, size, rows, 114)
ref, metas = prepare_batch(images, size, device, rows=rows, kernel=False)
diff = (out.int() - ref.int()).abs()
assert out.dtype == torch.uint8 and out.shape == ref.shape == (rows, 3, size, size), out.shape
assert [(m.ratio, m.pad) for m in metas] == placed
assert diff.max() <= 1, int(diff.max())  # at most one grey level, from the order of float operations
assert (diff > 0).float().mean() < 1e-3, float((diff > 0).float().mean())
assert torch.equal(out[len(shipped)], ref[len(shipped)])  # an exact fit is a copy
assert bool((out[len(images):] == 114).all())
print("share differing", float((diff > 0).float().mean()))
"""


def _compare(size: int, device: str, env: dict[str, str]) -> str:
    res = subprocess.run(
        [sys.executable, "-c", _COMPARE, str(size), device],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_letterbox_kernel_matches_the_per_size_path_in_the_interpreter():
    assert "share differing" in _compare(96, "cpu", {"TRITON_INTERPRET": "1"})


@requires_cuda
def test_letterbox_kernel_matches_the_per_size_path_on_the_gpu():
    assert "share differing" in _compare(640, "cuda", {})
    from yolov9.core.preprocess import letterbox_kernel_runs, letterbox_path, prepare_batch

    assert letterbox_kernel_runs(torch.device("cuda"))
    assert letterbox_path(2, torch.device("cuda")) == "kernel"
    im = torch.randint(0, 256, (3, 480, 640), dtype=torch.uint8, device="cuda")
    kernel, _ = prepare_batch([im, im[:, :100]], 640, "cuda", rows=8)
    by_size, _ = prepare_batch([im, im[:, :100]], 640, "cuda", rows=8, kernel=False)
    assert (kernel.int() - by_size.int()).abs().max() <= 1


def test_one_image_or_a_cpu_batch_is_letterboxed_size_by_size():
    """A lone image is one resize, cheaper than the kernel's gather and tables; off CUDA there is no kernel."""
    from yolov9.core.preprocess import letterbox_path

    assert letterbox_path(1, torch.device("cuda")) == "by size"
    assert letterbox_path(64, torch.device("cuda"), kernel=False) == "by size"
    assert letterbox_path(64, torch.device("cpu")) == "by size"
