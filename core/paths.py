"""Where the project's own files are: the import root (put on PYTHONPATH of the server processes), the sample
images and the small dataset shipped with the package."""

from __future__ import annotations

from pathlib import Path

# the folder that holds the `yolov9` package: the checkout (the stages beside yolov9/) or site-packages (inside it)
PACKAGE_ROOT = next(p for p in Path(__file__).resolve().parents if (p / "yolov9" / "__init__.py").is_file())
ASSETS = Path(__file__).resolve().parent / "assets"
SAMPLE_IMAGES = ASSETS / "images"
SHIPPED_DATASETS = ASSETS / "datasets"  # the last of the dataset roots: named datasets that always exist
DEFAULT_DATASET = "coco128"  # looked up in the dataset roots first
SHIPPED_DATASET = "coco48"  # used when the default is in no dataset root


def sample_images() -> list[Path]:
    return sorted(SAMPLE_IMAGES.glob("*.jpg"))
