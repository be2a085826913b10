"""Dataset formats -> one index of (image path, labels) with class names: YOLO txt (dataset YAML), COCO JSON
(instances_*.json) and Pascal VOC XML. Bad entries are counted and reported once, never fatal."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

IMG_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}
VOC_NAMES = [
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
]


@dataclass
class Problems:
    """What was wrong with the data, by kind, with file names; printed once as a summary."""

    items: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def add(self, kind: str, name: str | Path) -> None:
        self.items[kind].append(str(name))

    def summary(self) -> str:
        if not self.items:
            return "data: no problems found"
        lines = ["data problems (skipped or treated as background):"]
        for kind, names in self.items.items():
            shown = ", ".join(Path(n).name for n in names[:5]) + (" ..." if len(names) > 5 else "")
            lines.append(f"  {len(names)} {kind}: {shown}")
        return "\n".join(lines)


@dataclass
class DatasetIndex:
    images: list[Path]
    labels: list[np.ndarray]  # per image (n, 5) float32: class, cx, cy, w, h normalised to [0, 1]
    names: list[str]
    problems: Problems


def _check_labels(lab: np.ndarray, nc: int, name: str, problems: Problems) -> np.ndarray:
    """Drop rows with an unknown class or a box outside [0, 1]; clip tiny float overshoot."""
    if lab.size == 0:
        return np.zeros((0, 5), np.float32)
    lab = lab.astype(np.float32)
    ok = (lab[:, 0] >= 0) & (lab[:, 0] < nc) & (lab[:, 0] == np.round(lab[:, 0])) & np.isfinite(lab).all(1)
    x1, y1 = lab[:, 1] - lab[:, 3] / 2, lab[:, 2] - lab[:, 4] / 2
    x2, y2 = lab[:, 1] + lab[:, 3] / 2, lab[:, 2] + lab[:, 4] / 2
    ok &= (x1 > -0.01) & (y1 > -0.01) & (x2 < 1.01) & (y2 < 1.01) & (lab[:, 3] > 0) & (lab[:, 4] > 0)
    if not ok.all():
        problems.add("label files with out-of-range rows (rows dropped)", name)
    lab = lab[ok]
    xyxy = np.clip(np.stack((x1[ok], y1[ok], x2[ok], y2[ok]), 1), 0, 1)
    lab[:, 1:] = np.stack(
        (
            (xyxy[:, 0] + xyxy[:, 2]) / 2,
            (xyxy[:, 1] + xyxy[:, 3]) / 2,
            xyxy[:, 2] - xyxy[:, 0],
            xyxy[:, 3] - xyxy[:, 1],
        ),
        1,
    )
    return lab


def _names_list(names) -> list[str]:
    if isinstance(names, dict):
        return [str(names[k]) for k in sorted(names)]
    return [str(n) for n in names]


def dataset_roots() -> list[Path]:
    """Where named datasets (e.g. 'coco128') are looked up: $YOLOV9_DATASETS, then ../shared/datasets."""
    roots = [Path(os.environ["YOLOV9_DATASETS"])] if "YOLOV9_DATASETS" in os.environ else []
    here = Path(__file__).resolve()
    roots += [Path.cwd() / "../shared/datasets", here.parents[3] / "shared/datasets", Path.cwd() / "datasets"]
    return roots


def _yolo_labels_for(img: Path) -> Path:
    parts = list(img.parts)
    for i in range(len(parts) - 1, -1, -1):  # the last 'images' folder becomes 'labels'
        if parts[i] == "images":
            parts[i] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


def _list_images(src: Path) -> list[Path]:
    if src.is_dir():
        return sorted(p for p in src.rglob("*") if p.suffix.lower() in IMG_SUFFIXES)
    if src.suffix == ".txt":  # a list of image paths
        return [
            Path(line.strip()) if Path(line.strip()).is_absolute() else src.parent / line.strip()
            for line in src.read_text().splitlines()
            if line.strip()
        ]
    raise FileNotFoundError(f"{src}: not an image folder or list")


def load_yolo(images_src: Path, names: list[str]) -> DatasetIndex:
    problems = Problems()
    images, labels = [], []
    for img in _list_images(images_src):
        lab_path = _yolo_labels_for(img)
        if not lab_path.exists():
            problems.add("images without a label file (background)", img)
            lab = np.zeros((0, 5), np.float32)
        else:
            try:
                rows = [r.split() for r in lab_path.read_text().splitlines() if r.strip()]
                lab = np.array(rows, dtype=np.float32).reshape(-1, 5) if rows else np.zeros((0, 5), np.float32)
                if not rows:
                    problems.add("empty label files (background)", lab_path)
            except (ValueError, UnicodeDecodeError):
                problems.add("unreadable label files (treated as background)", lab_path)
                lab = np.zeros((0, 5), np.float32)
        images.append(img)
        labels.append(_check_labels(lab, len(names), lab_path.name, problems))
    return DatasetIndex(images, labels, names, problems)


def load_coco(ann_file: Path, images_dir: Path | None = None) -> DatasetIndex:
    """COCO JSON: category ids are mapped to contiguous indices in id order; crowd boxes are ignored."""
    d = json.loads(ann_file.read_text())
    cats = sorted(d["categories"], key=lambda c: c["id"])
    cat_index = {c["id"]: i for i, c in enumerate(cats)}
    if images_dir is None:  # .../annotations/instances_val2017.json -> .../val2017
        stem = ann_file.stem.split("_", 1)[-1]
        images_dir = next(
            (
                p
                for p in (
                    ann_file.parent.parent / stem,
                    ann_file.parent / stem,
                    ann_file.parent.parent / "images" / stem,
                )
                if p.is_dir()
            ),
            ann_file.parent,
        )
    per_image = defaultdict(list)
    for a in d["annotations"]:
        if not a.get("iscrowd", 0):
            per_image[a["image_id"]].append(a)
    problems = Problems()
    images, labels = [], []
    for im in sorted(d["images"], key=lambda x: x["id"]):
        w, h = im["width"], im["height"]
        rows = []
        for a in per_image.get(im["id"], []):
            x, y, bw, bh = a["bbox"]
            if a["category_id"] not in cat_index or bw <= 0 or bh <= 0:
                problems.add("annotations with unknown category or empty box (dropped)", im["file_name"])
                continue
            rows.append([cat_index[a["category_id"]], (x + bw / 2) / w, (y + bh / 2) / h, bw / w, bh / h])
        lab = np.array(rows, np.float32).reshape(-1, 5)
        images.append(images_dir / im["file_name"])
        labels.append(_check_labels(lab, len(cats), im["file_name"], problems))
    idx = DatasetIndex(images, labels, [c["name"] for c in cats], problems)
    idx.coco_category_ids = [c["id"] for c in cats]  # for writing results in the dataset's own ids
    return idx


def load_voc(root: Path, split: str = "train", names: list[str] | None = None) -> DatasetIndex:
    """Pascal VOC: root holds Annotations/*.xml and JPEGImages/; ImageSets/Main/{split}.txt if present."""
    names = names or VOC_NAMES
    problems = Problems()
    ids_file = root / "ImageSets" / "Main" / f"{split}.txt"
    xmls = (
        [root / "Annotations" / f"{i.strip()}.xml" for i in ids_file.read_text().split()]
        if ids_file.exists()
        else sorted((root / "Annotations").glob("*.xml"))
    )
    images, labels = [], []
    for x in xmls:
        try:
            tree = ET.parse(x).getroot()
            size = tree.find("size")
            w, h = float(size.find("width").text), float(size.find("height").text)
            fname = tree.findtext("filename") or f"{x.stem}.jpg"
            rows = []
            for obj in tree.iter("object"):
                name = obj.findtext("name", "").strip()
                if name not in names:
                    problems.add("objects with an unknown class (dropped)", x)
                    continue
                b = obj.find("bndbox")
                x1, y1, x2, y2 = (float(b.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax"))
                rows.append([names.index(name), (x1 + x2) / 2 / w, (y1 + y2) / 2 / h, (x2 - x1) / w, (y2 - y1) / h])
        except (ET.ParseError, AttributeError, TypeError, ValueError, FileNotFoundError):
            problems.add("unreadable annotation files (skipped)", x)
            continue
        images.append(root / "JPEGImages" / fname)
        labels.append(_check_labels(np.array(rows, np.float32).reshape(-1, 5), len(names), x.name, problems))
    return DatasetIndex(images, labels, names, problems)


def resolve_data(data: str | Path) -> dict:
    """A dataset spec as a dict {format, train, val, names, root}. `data` is a dataset YAML, a COCO JSON, a VOC
    folder, or the name of a dataset under the dataset roots (e.g. 'coco128', 'tiny_coco_val')."""
    p = Path(data)
    if not p.exists() and not p.suffix:
        for root in dataset_roots():
            if (root / str(data)).is_dir():
                p = root / str(data)
                break
        else:
            raise FileNotFoundError(
                f"dataset '{data}' not found (looked in {', '.join(map(str, dataset_roots()))}; "
                f"set YOLOV9_DATASETS or pass a dataset YAML)"
            )
    if p.suffix == ".json":
        return {"format": "coco", "train": p, "val": p, "root": p.parent}
    if p.is_dir():
        if (p / "Annotations").is_dir():
            return {"format": "voc", "train": p, "val": p, "root": p, "train_split": "train", "val_split": "val"}
        ann = sorted((p / "annotations").glob("instances_*.json")) if (p / "annotations").is_dir() else []
        if ann:
            return {"format": "coco", "train": ann[0], "val": ann[-1], "root": p}
        if (p / "images").is_dir():  # YOLO layout without a YAML: class ids as names unless 80 (COCO)
            return {"format": "yolo", "train": p / "images", "val": p / "images", "root": p, "names": None}
        raise FileNotFoundError(f"{p}: no images/, annotations/instances_*.json or Annotations/ inside")
    if p.suffix in (".yaml", ".yml"):
        d = yaml.safe_load(p.read_text())
        root = Path(d.get("path", p.parent))
        root = root if root.is_absolute() else (p.parent / root).resolve()
        fmt = d.get("format", "yolo")
        spec = {"format": fmt, "root": root, "names": d.get("names")}
        for split in ("train", "val"):
            v = d.get(split, d.get("train"))
            spec[split] = v if fmt == "voc" and not str(v).endswith("/") and not (root / str(v)).exists() else root / v
            if fmt == "voc":
                spec[split], spec[f"{split}_split"] = root, d.get(f"{split}_split", split)
        return spec
    raise FileNotFoundError(f"{data}: not a dataset YAML, COCO JSON or dataset folder")


def load_split(spec: dict, split: str) -> DatasetIndex:
    fmt = spec["format"]
    if fmt == "coco":
        return load_coco(Path(spec[split]), Path(spec[f"{split}_images"]) if f"{split}_images" in spec else None)
    if fmt == "voc":
        return load_voc(
            Path(spec[split]),
            spec.get(f"{split}_split", split),
            _names_list(spec["names"]) if spec.get("names") else None,
        )
    names = spec.get("names")
    if names is None:
        from train.data.coco_names import COCO_NAMES

        names = COCO_NAMES
    return load_yolo(Path(spec[split]), _names_list(names))
