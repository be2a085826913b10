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

from yolov9.core.coco_names import COCO_NAMES
from yolov9.core.errors import BadInput, MissingInput
from yolov9.core.paths import DEFAULT_DATASET, PACKAGE_ROOT, SHIPPED_DATASET, SHIPPED_DATASETS
from yolov9.core.yaml_io import read_yaml

IMG_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


@dataclass
class Problems:
    """What was wrong with the data, by kind, with file names; printed once as a summary."""

    items: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def add(self, kind: str, name: str | Path) -> None:
        self.items[kind].append(str(name))

    def summary(self, full: bool = False) -> str:
        """One line per kind with the first five names, or (full, for data_problems.txt) every path."""
        if not self.items:
            return "data: no problems found"
        lines = ["data problems (skipped or treated as background):"]
        for kind, names in self.items.items():
            if full:
                lines.append(f"  {len(names)} {kind}:")
                lines += [f"    {n}" for n in names]
                continue
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
    """Where named datasets (e.g. 'coco128') are looked up: $YOLOV9_DATASETS, ../shared/datasets, ./datasets, and
    last the datasets shipped with the package (coco48)."""
    roots = [Path(os.environ["YOLOV9_DATASETS"])] if os.environ.get("YOLOV9_DATASETS") else []
    roots += [Path.cwd() / "../shared/datasets", PACKAGE_ROOT.parent / "shared/datasets", Path.cwd() / "datasets"]
    return [*roots, SHIPPED_DATASETS]


def _find_named(name: str) -> Path | None:
    return next((root / name for root in dataset_roots() if (root / name).is_dir()), None)


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
    raise MissingInput(f"{src}: not an image folder or list")


def _class_ids_beyond(lab: np.ndarray, nc: int) -> list[int]:
    return sorted({int(c) for c in lab[:, 0] if c >= nc}) if lab.size else []


def load_yolo(images_src: Path, names: list[str]) -> DatasetIndex:
    """Images with the label file beside them (images/ -> labels/, .txt). A class id beyond the names is an error
    (the labels belong to another class list: training on would drop its boxes), reported with the first file."""
    problems = Problems()
    images, labels = [], []
    beyond: list[tuple[Path, list[int]]] = []
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
        if ids := _class_ids_beyond(lab, len(names)):
            beyond.append((lab_path, ids))
        images.append(img)
        labels.append(_check_labels(lab, len(names), lab_path.name, problems))
    if beyond:
        path, ids = beyond[0]
        every = sorted({i for _, found in beyond for i in found})
        listed = ", ".join(map(str, every[:10])) + (" ..." if len(every) > 10 else "")
        raise BadInput(
            f"{path}: label class {ids[-1]} exceeds nc={len(names)} (the dataset names {len(names)} classes); "
            f"{len(beyond)} label files use class ids {listed} beyond them: give the full names: list, or fix the "
            f"labels"
        )
    return DatasetIndex(images, labels, names, problems)


def require_boxes(index: DatasetIndex, spec: dict, split: str, allow_empty: bool) -> DatasetIndex:
    """A split with images but not one box trains nothing (usually labels that were not found): an error unless
    the run asks for background-only data."""
    if allow_empty or any(len(lab) for lab in index.labels):
        return index
    hint = ""
    if spec["format"] == "yolo" and index.images:
        expected = _yolo_labels_for(index.images[0])
        found = "no label files" if not expected.parent.is_dir() else "label files without boxes"
        hint = f" ({found}: expected e.g. {expected}, the image path with images/ -> labels/ and .txt)"
    raise BadInput(
        f"{split}: {len(index.images)} images and no boxes{hint}; pass --allow-empty to train on background images "
        f"on purpose"
    )


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
    return DatasetIndex(images, labels, [c["name"] for c in cats], problems)


def _voc_xmls(root: Path, ids_file: Path | None) -> list[Path]:
    if ids_file is None:
        return sorted((root / "Annotations").glob("*.xml"))
    return [root / "Annotations" / f"{i.split()[0]}.xml" for i in ids_file.read_text().splitlines() if i.strip()]


def voc_class_names(root: Path, ids_files: list[Path | None]) -> list[str]:
    """The sorted object names found in the XMLs of the given splits (the class list of a VOC folder whose
    dataset YAML names none; for Pascal VOC itself these are its 20 classes in their usual order)."""
    names = set()
    for x in {x for f in ids_files for x in _voc_xmls(root, f)}:
        try:
            names.update(n.strip() for n in (o.findtext("name") or "" for o in ET.parse(x).getroot().iter("object")))
        except (ET.ParseError, OSError):
            continue  # reported by load_voc
    return sorted(n for n in names if n)


def load_voc(root: Path, ids_file: Path | None, names: list[str]) -> DatasetIndex:
    """Pascal VOC: root holds Annotations/*.xml and JPEGImages/; ids_file (e.g. ImageSets/Main/trainval.txt)
    lists the images of the split, None means every XML."""
    problems = Problems()
    images, labels = [], []
    for x in _voc_xmls(root, ids_file):
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


def resolve_data(data: str | Path | None = None) -> dict:
    """A dataset spec as a dict {format, name, root, train, val, names}. `data` is a dataset YAML, a COCO JSON, a
    VOC folder, a YOLO folder, or the name of a dataset under the dataset roots (e.g. 'coco128'). None is the
    default: coco128 where a dataset root holds it, else the shipped coco48."""
    if data is None:
        found = _find_named(DEFAULT_DATASET)
        if found is None:
            print(f"data: no {DEFAULT_DATASET} in the dataset roots; using the shipped sample {SHIPPED_DATASET}")
            found = SHIPPED_DATASETS / SHIPPED_DATASET
        return _resolve_path(found)
    p = Path(data)
    if not p.exists() and not p.suffix:
        found = _find_named(str(data))
        if found is None:
            raise MissingInput(
                f"dataset '{data}' not found (looked in {', '.join(map(str, dataset_roots()))}): pass a dataset YAML "
                f"or folder, set YOLOV9_DATASETS to the folder holding '{data}', or use the shipped {SHIPPED_DATASET}"
            )
        p = found
    if not p.exists():
        raise MissingInput(f"{p}: no such dataset file or folder")
    return _resolve_path(p)


def _resolve_path(p: Path) -> dict:
    if p.suffix == ".json":
        return {"format": "coco", "name": p.stem, "root": p.parent, "train": p, "val": p, "names": None}
    if p.suffix in (".yaml", ".yml"):
        return _resolve_yaml(p)
    if not p.is_dir():
        raise MissingInput(f"{p}: not a dataset YAML, COCO JSON or dataset folder")
    yamls = [p / "data.yaml"] if (p / "data.yaml").is_file() else sorted([*p.glob("*.yaml"), *p.glob("*.yml")])
    if len(yamls) == 1:  # a folder that describes itself
        return _resolve_yaml(yamls[0])
    if len(yamls) > 1:
        raise BadInput(f"{p}: holds {len(yamls)} YAML files ({', '.join(y.name for y in yamls)}): pass one as --data")
    spec = {"name": p.name, "root": p, "names": None}
    if (p / "Annotations").is_dir():
        return _with_voc_names({**spec, "format": "voc", "train": _voc_split(p, "train"), "val": _voc_split(p, "val")})
    ann = sorted((p / "annotations").glob("instances_*.json")) if (p / "annotations").is_dir() else []
    if ann:  # instances_train*.json sorts before instances_val*.json
        return {**spec, "format": "coco", "train": ann[0], "val": ann[-1]}
    if (p / "images").is_dir():  # YOLO layout without a YAML: the 80 COCO names; images/train*, images/val* splits
        train = sorted(d for d in (p / "images").glob("train*") if d.is_dir())
        val = sorted(d for d in (p / "images").glob("val*") if d.is_dir())
        if train and val:
            return {**spec, "format": "yolo", "train": train[0], "val": val[0]}
        return {**spec, "format": "yolo", "train": p / "images", "val": p / "images"}
    raise MissingInput(f"{p}: no images/, annotations/instances_*.json or Annotations/ inside")


def _voc_split(root: Path, split: str) -> Path:
    """ImageSets/Main/{split}.txt (train falls back to trainval.txt) when present, else the folder (every XML)."""
    for name in (split, "trainval") if split == "train" else (split,):
        f = root / "ImageSets" / "Main" / f"{name}.txt"
        if f.is_file():
            return f
    return root


def _with_voc_names(spec: dict) -> dict:
    if not spec["names"]:
        split_files = [None if Path(spec[s]).is_dir() else Path(spec[s]) for s in ("train", "val")]
        spec["names"] = voc_class_names(spec["root"], split_files)
        if not spec["names"]:
            raise MissingInput(f"{spec['root']}: no object names in Annotations/*.xml; give names: in a dataset YAML")
    return spec


def _resolve_yaml(p: Path) -> dict:
    d = read_yaml(p)
    if not isinstance(d, dict):
        raise BadInput(f"{p}: a dataset YAML is a mapping with train:, val: and names: keys")
    given = Path(d.get("path", "."))
    root = given if given.is_absolute() else (p.parent / given).resolve()
    if not root.is_dir():
        hint = "" if given.is_absolute() else f" ({given} is read from the YAML's folder)"
        raise MissingInput(f"{p}: path: {d.get('path')} -> {root} does not exist{hint}")
    fmt = d.get("format", "yolo")
    if fmt not in ("yolo", "coco", "voc"):
        raise BadInput(f"{p}: format: {fmt}: choose yolo, coco or voc")
    spec = {"format": fmt, "name": p.stem, "root": root, "names": _names_list(d["names"]) if d.get("names") else None}
    for split in ("train", "val"):
        value = d.get(split, d.get("train"))
        if value is None:
            if fmt != "voc":
                raise BadInput(f"{p}: no train: key (the images, image list or annotation file to train on)")
            spec[split] = _voc_split(root, split)
            continue
        path = Path(value) if Path(value).is_absolute() else root / value
        if not path.exists():
            key = split if split in d else "train"
            raise MissingInput(
                f"{p}: {key}: {value} -> {path} does not exist (paths are relative to path: {root}); fix the key or "
                f"the path: key"
            )
        spec[split] = path
        if fmt == "coco" and d.get(f"{split}_images"):  # images elsewhere than beside the annotation file
            spec[f"{split}_images"] = root / d[f"{split}_images"]
    if fmt == "yolo" and spec["names"] is None:
        raise BadInput(f"{p}: no names: key (a list of class names, or a dict id -> name)")
    return _with_voc_names(spec) if fmt == "voc" else spec


def load_split(spec: dict, split: str) -> DatasetIndex:
    fmt, src = spec["format"], Path(spec[split])
    if fmt == "coco":
        return load_coco(src, Path(spec[f"{split}_images"]) if spec.get(f"{split}_images") else None)
    if fmt == "voc":
        return load_voc(spec["root"], None if src.is_dir() else src, spec["names"])
    return load_yolo(src, spec["names"] or COCO_NAMES)
