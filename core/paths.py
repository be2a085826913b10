"""Where the project's own files are: the import root (put on PYTHONPATH of the server processes), the sample
images and the small dataset shipped with the package."""

from __future__ import annotations

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the folder holding core/, train/, export/, serve/
ASSETS = Path(__file__).resolve().parent / "assets"
SAMPLE_IMAGES = ASSETS / "images"
SHIPPED_DATASETS = ASSETS / "datasets"  # the last of the dataset roots: named datasets that always exist
DEFAULT_DATASET = "coco128"  # looked up in the dataset roots first
SHIPPED_DATASET = "coco48"  # used when the default is in no dataset root


def sample_images() -> list[Path]:
    return sorted(SAMPLE_IMAGES.glob("*.jpg"))
