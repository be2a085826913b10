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


@pytest.fixture(scope="session")
def tiny_subset(coco128, tmp_path_factory) -> Path:
    """The first 16 coco128 images as a YOLO dataset folder (80 COCO classes)."""
    import shutil

    root = tmp_path_factory.mktemp("tiny")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    for img in sorted((coco128 / "images" / "train2017").glob("*.jpg"))[:16]:
        shutil.copy(img, root / "images" / img.name)
        lab = coco128 / "labels" / "train2017" / f"{img.stem}.txt"
        if lab.exists():
            shutil.copy(lab, root / "labels" / lab.name)
    return root


# Augmentation off and a higher LR: tiny CPU runs that overfit 16 images quickly and deterministically.
LIGHT_HYP = {
    "mosaic": 0.0,
    "mixup": 0.0,
    "scale": 0.0,
    "translate": 0.0,
    "hsv_h": 0.0,
    "hsv_s": 0.0,
    "hsv_v": 0.0,
    "fliplr": 0.0,
    "warmup_epochs": 0.0,
    "lr0": 0.02,
}


def tiny_train_config(data, project, **kw):
    """A gelan-t CPU training config for tests; keywords override."""
    from train.trainer import TrainConfig

    base = dict(
        data=str(data),
        cfg="gelan-t",
        img=128,
        batch=8,
        nbs=8,
        workers=0,
        amp="off",
        device="cpu",
        project=str(project),
        close_mosaic=0,
        val=False,
        hyp=LIGHT_HYP,
        seed=0,
    )
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="session")
def trained_tiny(tiny_subset, tmp_path_factory) -> Path:
    """gelan-t overfitted on 16 images at 160 px (about a minute on 2 cores): a model whose detections and mAP
    mean something, so export and serving comparisons cannot pass by all being empty."""
    from train.trainer import Trainer

    cfg = tiny_train_config(
        tiny_subset, tmp_path_factory.mktemp("runs"), img=160, epochs=40, batch=4, nbs=4, name="tiny"
    )
    return Path(Trainer(cfg).fit()["run_dir"]) / "weights" / "best.pt"


@pytest.fixture(scope="session")
def aoti_cpu_package(trained_tiny, tmp_path_factory) -> Path:
    """trained_tiny compiled by AOTInductor for the CPU (fp32, 160 px, batch up to 8), with one --inductor option
    passed through (about 30 s on 2 cores)."""
    from export.aoti import export_aoti

    options = {"aot_inductor.compile_wrapper_opt_level": "O0"}
    out = tmp_path_factory.mktemp("aoti") / "m.pt2"
    return export_aoti(trained_tiny, out, 160, False, "cpu", 8, inductor_configs=options)
