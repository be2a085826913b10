"""Shared fixtures: the reference data beside the checkout (../shared) and small helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLOV9_SHARED", ROOT.parent / "shared"))
INTEROP = SHARED / "interop"
DATASETS = SHARED / "datasets"

torch.set_num_threads(min(2, os.cpu_count() or 1))


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"reference data {path} is not present (expected ../shared beside the checkout)")
    return path


@pytest.fixture(scope="session")
def interop() -> Path:
    return need(INTEROP)


@pytest.fixture(scope="session")
def coco128() -> Path:
    return need(DATASETS / "coco128")


@pytest.fixture(scope="session")
def tiny_coco() -> Path:
    return need(DATASETS / "tiny_coco_val")


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")
