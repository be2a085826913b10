"""Shared fixtures: the shipped sample dataset (coco48), the official reference data beside the checkout
(../shared/interop, the only data a test may skip for) and small helpers."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("YOLOV9_SHARED", ROOT.parent / "shared"))
INTEROP = SHARED / "interop"

# the suite runs in pytest-xdist workers (the README's test command): each takes its share of the cores
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // WORKERS)))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The serving tests share one Triton server and gateway per worker: they run in one worker (`--dist
    loadgroup`), so the servers start once, and the other worker takes the rest."""
    for item in items:
        if item.path.is_relative_to(ROOT / "tests" / "serve"):
            item.add_marker(pytest.mark.xdist_group("serve"))


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Path]) -> Path:
    """A session fixture's file, built into a fresh folder: under pytest-xdist by the first worker that asks (the
    others wait for it and share the file), so the minutes of training or compiling are spent once."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent / name  # the folder all workers' temporary folders share
    with FileLock(f"{root}.lock"):
        done = root / "built.txt"
        if not done.exists():
            root.mkdir()
            done.write_text(str(build(root)))
        return Path(done.read_text())


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"reference data {path} is not present (expected ../shared beside the checkout)")
    return path


@pytest.fixture(scope="session")
def interop() -> Path:
    return need(INTEROP)


@pytest.fixture(scope="session")
def coco48() -> Path:
    """The dataset shipped inside the package: 48 coco128 images, YOLO labels, one background image."""
    from yolov9.core.paths import SHIPPED_DATASET, SHIPPED_DATASETS

    return SHIPPED_DATASETS / SHIPPED_DATASET


# the category ids of COCO's 80 classes in its annotation files (1-90 with gaps)
COCO_IDS = [
    *range(1, 12),
    *range(13, 26),
    27,
    28,
    *range(31, 45),
    *range(46, 66),
    67,
    70,
    *range(72, 83),
    *range(84, 91),
]


@pytest.fixture(scope="session")
def coco_json(coco48, tmp_path_factory) -> Path:
    """coco48 written as a COCO instances JSON beside its images (val2017/), with COCO's sparse category ids
    (1-90) and one crowd box, as the official annotation files have."""
    import json

    from PIL import Image

    from yolov9.core.coco_names import COCO_NAMES

    root = tmp_path_factory.mktemp("coco")
    (root / "annotations").mkdir()
    (root / "val2017").symlink_to(coco48 / "images", target_is_directory=True)
    images, anns = [], []
    for k, img in enumerate(sorted((coco48 / "images").glob("*.jpg"))):
        w, h = Image.open(img).size
        images.append({"id": k + 1, "file_name": img.name, "width": w, "height": h})
        lab = coco48 / "labels" / f"{img.stem}.txt"
        for row in lab.read_text().split("\n") if lab.exists() else []:
            if row.strip():
                c, x, y, bw, bh = map(float, row.split())
                box = [(x - bw / 2) * w, (y - bh / 2) * h, bw * w, bh * h]
                anns.append(
                    {
                        "id": len(anns) + 1,
                        "image_id": k + 1,
                        "category_id": COCO_IDS[int(c)],
                        "bbox": box,
                        "area": box[2] * box[3],
                        "iscrowd": int(len(anns) == 0),
                    }
                )
    cats = [{"id": i, "name": n} for i, n in zip(COCO_IDS, COCO_NAMES)]
    out = root / "annotations" / "instances_val2017.json"
    out.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return out


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def outputs(out) -> list[torch.Tensor]:
    """A model's output (a tensor, or nested lists of them) as a flat list."""
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in outputs(o)]


def rows_per_image(b: int, n: int, nc: int, g: torch.Generator) -> torch.Tensor:
    """(b * n, 6) target rows (image, class, xywh), n random boxes in each of b images, in image order."""
    image = torch.arange(b).repeat_interleave(n).unsqueeze(1).float()
    return torch.cat((image, torch.randint(0, nc, (b * n, 1), generator=g).float(),
                      torch.rand(b * n, 4, generator=g) * 0.4 + 0.2), 1)  # fmt: skip


def boxes_in_first_image(boxes: int, nc: int) -> torch.Tensor:
    """(boxes, 6) target rows (image 0, class, xywh) with every box in the first image, so the padded count grows."""
    return torch.cat([torch.zeros(boxes, 1), torch.randint(0, nc, (boxes, 1)), torch.rand(boxes, 2) * 0.6 + 0.2,
                      torch.rand(boxes, 2) * 0.3 + 0.05], 1).float()  # fmt: skip


def alive(pid: int) -> bool:
    """Whether process `pid` still runs; a zombie is gone for every purpose here (it waits only for init to reap
    it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")


@pytest.fixture(scope="session")
def tiny_subset(coco48, tmp_path_factory) -> Path:
    """The first 16 coco48 images (those of coco128) as a YOLO dataset folder (80 COCO classes)."""
    import shutil

    root = tmp_path_factory.mktemp("tiny")
    (root / "images").mkdir()
    (root / "labels").mkdir()
    for img in sorted((coco48 / "images").glob("*.jpg"))[:16]:
        shutil.copy(img, root / "images" / img.name)
        lab = coco48 / "labels" / f"{img.stem}.txt"
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
    from yolov9.train.trainer import TrainConfig

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
    """gelan-t overfitted on 16 images at 160 px (one to two minutes on 2 cores): a model whose detections and mAP
    mean something, so export and serving comparisons cannot pass by all being empty. 80 epochs, not fewer: at 40
    the high learning rate had not settled, and a CPU's rounding (its kernels, the thread count) decided whether the
    model found anything at conf 0.25; at 80 it converges the same way under one thread and two."""
    from yolov9.train.trainer import Trainer

    def train(root: Path) -> Path:
        cfg = tiny_train_config(tiny_subset, root, img=160, epochs=80, batch=4, nbs=4, name="tiny")
        return Path(Trainer(cfg).fit()["run_dir"]) / "weights" / "best.pt"

    return built_once(tmp_path_factory, "runs", train)


# the compile's cost is C++ code generation and the C++ compiler, not the tests' few forward passes
AOTI_TEST_OPTIONS = {
    "aot_inductor.compile_wrapper_opt_level": "O0",
    "aot_inductor.debug_compile": True,
    "cpp.simdlen": 1,
}


@pytest.fixture(scope="session")
def aoti_cpu_package(trained_tiny, tmp_path_factory) -> Path:
    """trained_tiny compiled by AOTInductor for the CPU (fp32, 160 px, batch up to 8), with --inductor options
    passed through: scalar kernels built at -O0 (about 75 s on 2 cores, against 105 s vectorised at -O3; the tests
    run a few small batches)."""
    from yolov9.export.aoti import export_aoti

    def compile_package(root: Path) -> Path:
        return export_aoti(trained_tiny, root / "m.pt2", 160, False, "cpu", 8, inductor_configs=AOTI_TEST_OPTIONS)

    return built_once(tmp_path_factory, "aoti", compile_package)
