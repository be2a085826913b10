"""Dataset formats, bad data handling, augmentation output and the rank-aware sampler."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from yolov9.core.errors import BadInput
from yolov9.core.paths import sample_images
from yolov9.train.config import Hyp
from yolov9.train.data.dataset import (
    Cache,
    DetectionDataset,
    EpochBatchSampler,
    eval_loader,
    run_batches,
    train_loader,
)
from yolov9.train.data.formats import load_split, resolve_data


def test_yolo_folder_loads_with_background_report(coco48):
    idx = load_split(resolve_data(coco48), "train")
    assert len(idx.images) == 48 and len(idx.names) == 80
    assert sum(len(lab) for lab in idx.labels) == 406
    assert "1 images without a label file" in idx.problems.summary()


def test_coco_json_loads_with_its_class_names(coco_json, coco48):
    idx = load_split(resolve_data(coco_json), "val")
    assert len(idx.images) == 48 and idx.names[0] == "person" and len(idx.names) == 80
    assert all(p.exists() for p in idx.images)
    assert sum(len(lab) for lab in idx.labels) == 405  # the one crowd box is left out
    yolo = load_split(resolve_data(coco48), "train")  # sparse category ids map back to the contiguous ones
    by_name = {p.name: lab for p, lab in zip(yolo.images, yolo.labels)}
    second = [i for i, lab in enumerate(idx.labels) if len(lab)][1]  # the first holds the crowd box
    np.testing.assert_allclose(idx.labels[second], by_name[idx.images[second].name], atol=1e-5)


def _make_voc(root: Path, coco48: Path, n: int = 4) -> None:
    (root / "Annotations").mkdir(parents=True)
    (root / "JPEGImages").mkdir()
    names = ["person", "car", "dog"]
    from PIL import Image

    imgs = sorted((coco48 / "images").glob("*.jpg"))[:n]
    for k, img in enumerate(imgs):
        shutil.copy(img, root / "JPEGImages" / img.name)
        w, h = Image.open(img).size
        objs = "".join(
            f"<object><name>{names[j % 3]}</name><bndbox><xmin>{10 + j}</xmin><ymin>20</ymin>"
            f"<xmax>{100 + j}</xmax><ymax>120</ymax></bndbox></object>"
            for j in range(k + 1)
        )
        objs += (
            "<object><name>unicorn</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>5</xmax><ymax>5</ymax></bndbox>"
            "</object>"
        )
        (root / "Annotations" / f"{img.stem}.xml").write_text(
            f"<annotation><filename>{img.name}</filename><size><width>{w}</width><height>{h}</height></size>"
            f"{objs}</annotation>"
        )
    (root / "Annotations" / "broken.xml").write_text("<annotation><size>")


def test_voc_xml_loads_and_reports_unknown_classes(coco48, tmp_path):
    _make_voc(tmp_path / "voc", coco48)
    (tmp_path / "voc.yaml").write_text(
        yaml.safe_dump({"path": "voc", "format": "voc", "train": ".", "val": ".", "names": ["person", "car", "dog"]})
    )
    idx = load_split(resolve_data(tmp_path / "voc.yaml"), "train")
    assert len(idx.images) == 4 and idx.names == ["person", "car", "dog"]
    assert [len(lab) for lab in idx.labels] == [1, 2, 3, 4]
    summary = idx.problems.summary()
    assert "unknown class" in summary and "unreadable annotation" in summary and "broken.xml" in summary
    ds = DetectionDataset(idx, 128)
    img, lab, _, _ = ds[0]
    assert img.shape == (3, 128, 128) and img.dtype == torch.uint8


@pytest.fixture()
def messy_dataset(coco48, tmp_path) -> Path:
    """A YOLO dataset with a truncated JPEG, a text file named .jpg, labels out of range, an empty label file
    and an image without labels."""
    root = tmp_path / "messy"
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    src = sorted((coco48 / "images").glob("*.jpg"))[:6]
    for img in src:
        shutil.copy(img, root / "images" / img.name)
        lab = coco48 / "labels" / f"{img.stem}.txt"
        if lab.exists():
            shutil.copy(lab, root / "labels" / lab.name)
    data = (root / "images" / src[0].name).read_bytes()
    (root / "images" / src[0].name).write_bytes(data[: len(data) // 2])  # truncated
    (root / "images" / "notes.jpg").write_text("not an image")
    (root / "labels" / "notes.txt").write_text("0 0.5 0.5 0.1 0.1\n")
    (root / "labels" / f"{src[1].stem}.txt").write_text("0 0.5 0.5 0.2 0.2\n3 1.8 0.5 0.2 0.2\n")
    (root / "labels" / f"{src[2].stem}.txt").write_text("")
    (root / "labels" / f"{src[3].stem}.txt").unlink(missing_ok=True)
    (root / "labels" / f"{src[4].stem}.txt").write_text("garbage line\n")
    return root


def test_bad_data_is_skipped_and_reported_once(messy_dataset):
    idx = load_split(resolve_data(messy_dataset), "train")
    ds = DetectionDataset(idx, 160, augment=Hyp())
    summary = ds.problems.summary()
    assert len(ds) == 5  # 7 files, truncated and fake image skipped
    for kind in (
        "truncated",
        "unreadable or corrupt images",
        "out-of-range rows",
        "empty label files",
        "without a label file",
        "unreadable label files",
    ):
        assert kind in summary, kind
    assert "notes.jpg" in summary
    rows = {p.stem: len(lab) for p, lab in zip(ds.images, ds.labels)}
    stems = sorted(p.stem for p in (messy_dataset / "images").glob("0*.jpg"))  # the six copied photographs
    # out-of-range file keeps its one valid row; empty, missing and garbage label files give background images
    assert [rows[s] for s in stems[1:5]] == [1, 0, 0, 0]
    assert rows[stems[5]] == len((messy_dataset / "labels" / f"{stems[5]}.txt").read_text().split("\n")) - 1
    loader = train_loader(ds, EpochBatchSampler(len(ds), 4, epochs=1))
    seen = sum(b.images.shape[0] for b in loader)
    assert seen == 5
    full = ds.problems.summary(full=True)  # data_problems.txt: every file, with its path
    assert str(messy_dataset / "images" / "notes.jpg") in full and "..." not in full


def _yolo_set(root: Path, coco48: Path, n: int, names: int, labels: bool = True) -> Path:
    """n coco48 images as a YOLO folder with a data.yaml of `names` classes (COCO class ids kept)."""
    (root / "images").mkdir(parents=True)
    for img in sorted((coco48 / "images").glob("*.jpg"))[:n]:
        shutil.copy(img, root / "images" / img.name)
        lab = coco48 / "labels" / f"{img.stem}.txt"
        if labels and lab.exists():
            (root / "labels").mkdir(exist_ok=True)
            shutil.copy(lab, root / "labels" / lab.name)
    (root / "data.yaml").write_text(f"path: .\ntrain: images\nval: images\nnames: {[f'c{i}' for i in range(names)]}\n")
    return root


def test_class_ids_beyond_the_names_stop_with_the_id_the_count_and_a_file(coco48, tmp_path):
    root = _yolo_set(tmp_path / "few", coco48, 8, names=3)
    with pytest.raises(BadInput, match=r"labels/\S+\.txt: label class \d+ exceeds nc=3 .*label files use class ids"):
        load_split(resolve_data(root / "data.yaml"), "train")


def test_a_split_without_boxes_stops_unless_allowed(coco48, tmp_path):
    from yolov9.train.data.formats import require_boxes

    root = _yolo_set(tmp_path / "nolabels", coco48, 4, names=80, labels=False)
    spec = resolve_data(root / "data.yaml")
    index = load_split(spec, "train")
    with pytest.raises(BadInput, match=r"train: 4 images and no boxes \(no label files: expected e\.g\. .*labels/"):
        require_boxes(index, spec, "train", allow_empty=False)
    assert require_boxes(index, spec, "train", allow_empty=True) is index


def test_a_folder_with_a_data_yaml_uses_it(coco48, tmp_path):
    root = _yolo_set(tmp_path / "withyaml", coco48, 4, names=80)
    (root / "data.yaml").write_text("path: .\ntrain: images\nval: images\nnames: [a, b]\n")
    spec = resolve_data(root)
    assert spec["names"] == ["a", "b"] and spec["name"] == "data"
    (root / "data.yaml").rename(root / "mine.yaml")
    assert resolve_data(root)["name"] == "mine"
    (root / "other.yml").write_text("path: .\ntrain: images\nnames: [x]\n")
    with pytest.raises(BadInput, match="holds 2 YAML files"):
        resolve_data(root)


def test_yaml_errors_keep_their_line_and_column(tmp_path):
    bad = tmp_path / "tab.yaml"
    bad.write_text("path: .\ntrain: images\nnames:\n\t- a\n")
    with pytest.raises(BadInput, match=r"tab\.yaml:4:1: not valid YAML: .*tab"):
        resolve_data(bad)


def test_augmented_samples_are_deterministic_per_epoch(coco48):
    ds = DetectionDataset(load_split(resolve_data(coco48), "train"), 160, augment=Hyp())
    a, la, _, _ = ds[(3, 7)]
    b, lb, _, _ = ds[(3, 7)]
    c, _, _, _ = ds[(4, 7)]
    assert torch.equal(a, b) and torch.equal(la, lb) and not torch.equal(a, c)
    assert a.shape == (3, 160, 160) and a.dtype == torch.uint8
    assert (la[:, 1:] >= 0).all() and (la[:, 1:] <= 1).all()
    ds.mosaic_until = 3  # close-mosaic: from epoch 3 on, single images
    d, _, _, _ = ds[(3, 7)]
    assert d.shape == (3, 160, 160) and not torch.equal(a, d)


def test_cache_modes_give_identical_samples(coco48, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    idx = load_split(resolve_data(coco48), "train")
    idx.images, idx.labels = idx.images[:8], idx.labels[:8]
    plain = DetectionDataset(idx, 128, augment=Hyp())
    ram = DetectionDataset(idx, 128, augment=Hyp(), cache=Cache("ram", workers=2))
    disk = DetectionDataset(idx, 128, augment=Hyp(), cache=Cache("disk", workers=2))
    for i in range(3):
        assert torch.equal(plain[i][0], ram[i][0]) and torch.equal(plain[i][0], disk[i][0])


def test_batch_sampler_runs_epochs_back_to_back_and_splits_ranks():
    parts = []
    for rank in range(3):
        s = EpochBatchSampler(10, 3, seed=1, shard=(rank, 3), start_epoch=2, epochs=4)
        batches = list(s)
        assert len(s) == 2 and [len(b) for b in batches] == [3, 1, 3, 1]  # a batch never spans two epochs
        assert [b[0][0] for b in batches] == [2, 2, 3, 3]
        parts.append([i for b in batches[:2] for _, i in b])
    flat = sorted(x for p in parts for x in p)
    assert set(flat) == set(range(10)) and len(flat) == 12
    s = EpochBatchSampler(10, 4, seed=1)
    first = [b for _, b in zip(range(6), s)]  # without `epochs` it never ends
    assert [b[0][0] for b in first] == [0, 0, 0, 1, 1, 1]
    assert sorted(i for b in first[:3] for _, i in b) == list(range(10))
    assert [i for _, i in first[0]] != [i for _, i in first[3]]
    np.testing.assert_array_equal(s.epoch_indices(5), s.epoch_indices(5))


def test_loader_keys_carry_the_epoch(coco48):
    ds = DetectionDataset(load_split(resolve_data(coco48), "train"), 96, augment=Hyp())
    ds.images, ds.labels = ds.images[:6], ds.labels[:6]
    loader = train_loader(ds, EpochBatchSampler(len(ds), 4, start_epoch=5, epochs=7), workers=2)
    batches = list(loader)
    assert len(batches) == 4 and [len(b.indices) for b in batches] == [4, 2, 4, 2]
    direct = ds[(5, int(batches[0].indices[0]))][0]
    assert torch.equal(batches[0].images[0], direct)


def test_the_runs_first_batch_built_in_parts_is_the_same_batch(coco48):
    ds = DetectionDataset(load_split(resolve_data(coco48), "train"), 96, augment=Hyp())
    ds.images, ds.labels = ds.images[:11], ds.labels[:11]
    split = EpochBatchSampler(len(ds), 7, start_epoch=3, epochs=5, first_split=3)
    assert [len(b) for b in split] == [2, 3, 2, 4, 7, 4]  # the first batch as 3 parts, then whole batches
    whole = list(train_loader(ds, EpochBatchSampler(len(ds), 7, start_epoch=3, epochs=5), workers=2))
    parts = list(run_batches(train_loader(ds, split, workers=2)))
    assert len(parts) == len(whole) == 4
    for a, b in zip(parts, whole):
        for x, y in zip(a[:3], b[:3]):  # images, target rows, indices
            assert torch.equal(x, y)
    assert parts[0].rows[:, 0].unique().numel() > 1  # the joined rows number their images past the first part
    assert len(list(EpochBatchSampler(2, 4, epochs=1, first_split=8))) == 2  # never an empty part


def test_decode_images_keeps_going_past_bad_ones(coco48):
    from yolov9.core.decode import decode_images
    from yolov9.core.preprocess import ImageError

    good = sorted((coco48 / "images").glob("*.jpg"))[0].read_bytes()
    out = decode_images([good, b"junk" * 20, good[: len(good) // 4], good])
    assert out[0].shape[0] == 3 and out[0].dtype == torch.uint8 and torch.equal(out[0], out[3])
    assert isinstance(out[1], ImageError)
    assert isinstance(out[2], ImageError)  # truncated: refused, not half-decoded


def test_prepare_batch_equals_letterbox_image_by_image():
    from yolov9.core.decode import decode_image
    from yolov9.core.preprocess import letterbox, prepare_batch

    shipped = [decode_image(f) for f in sorted(sample_images())]
    # repeated sizes (one resize per size), an exact fit, an upscale, a tall and a wide crop
    images = shipped + shipped[:1] + [shipped[0][:, :160, :160], shipped[0][:, :320, :320], shipped[-1][:, :, :90]]
    images += [shipped[-1][:, :70, :]]
    batch, metas = prepare_batch(images, 320)
    one_by_one = [letterbox(im, 320) for im in images]
    assert batch.dtype == torch.uint8 and batch.shape == (len(images), 3, 320, 320)
    assert torch.equal(batch, torch.stack([b for b, _ in one_by_one]))
    assert metas == [m for _, m in one_by_one]
    assert prepare_batch([], 320)[0].shape == (0, 3, 320, 320)
    padded, _ = prepare_batch(images, 320, rows=len(images) + 2)  # up to a batch size with a CUDA graph
    assert torch.equal(padded[: len(images)], batch) and bool((padded[len(images) :] == 114).all())


def test_voc_yaml_split_files_and_class_names_from_the_xmls(coco48, tmp_path):
    """BCCD-style: no names given, split files under ImageSets/Main named by the YAML's train:/val: keys."""
    root = tmp_path / "bccd"
    _make_voc(root, coco48, n=4)
    stems = sorted(p.stem for p in (root / "JPEGImages").glob("*.jpg"))
    (root / "ImageSets" / "Main").mkdir(parents=True)
    (root / "ImageSets" / "Main" / "trainval.txt").write_text("\n".join(stems[:3]) + "\n")
    (root / "ImageSets" / "Main" / "test.txt").write_text(stems[3] + "\n")
    cfg = {"path": "bccd", "format": "voc", "train": "ImageSets/Main/trainval.txt", "val": "ImageSets/Main/test.txt"}
    (tmp_path / "bccd.yaml").write_text(yaml.safe_dump(cfg))
    spec = resolve_data(tmp_path / "bccd.yaml")
    train, val = load_split(spec, "train"), load_split(spec, "val")
    assert train.names == val.names == ["car", "dog", "person", "unicorn"]  # sorted names found in the XMLs
    assert [p.stem for p in train.images] == stems[:3] and [p.stem for p in val.images] == stems[3:]
    assert [len(lab) for lab in train.labels] == [2, 3, 4] and [len(lab) for lab in val.labels] == [5]
    assert "unknown class" not in train.problems.summary()
    # a VOC folder given directly uses its ImageSets/Main/trainval.txt for training too
    assert [p.stem for p in load_split(resolve_data(root), "train").images] == stems[:3]


@pytest.mark.parametrize(
    "content,expect",
    [
        ({"path": "nowhere", "train": "images", "names": ["a"]}, "path: nowhere .* read from the YAML's folder"),
        ({"path": "/no/such/root", "train": "images", "names": ["a"]}, r"/no/such/root does not exist$"),
        ({"train": "images/train", "val": "images/val", "names": ["a"]}, "train: images/train"),
        ({"names": ["a"]}, "no train: key"),
        ({"train": "."}, "no names: key"),
        ({"train": ".", "names": ["a"], "format": "darknet"}, "choose yolo, coco or voc"),
    ],
)
def test_yaml_that_points_at_nothing_names_the_path_and_the_fix(tmp_path, content, expect):
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(content))
    with pytest.raises((FileNotFoundError, ValueError), match=expect) as e:
        resolve_data(tmp_path / "d.yaml")
    assert "d.yaml" in str(e.value) and "\n" not in str(e.value)


def test_named_dataset_lookup_and_the_shipped_default(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("YOLOV9_DATASETS", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no ../shared/datasets or ./datasets from here
    with pytest.raises(FileNotFoundError, match="not found.*YOLOV9_DATASETS.*coco48"):
        resolve_data("no_such_set")
    spec = resolve_data("coco48")
    assert spec["format"] == "yolo" and spec["name"] == "coco48"
    import yolov9.train.data.formats as formats
    from yolov9.core import paths

    monkeypatch.setattr(formats, "PACKAGE_ROOT", tmp_path / "pkg")  # hide the checkout's ../shared
    assert resolve_data(None)["root"] == paths.SHIPPED_DATASETS / "coco48"
    assert "using the shipped sample coco48" in capsys.readouterr().out
    (tmp_path / "coco128" / "images").mkdir(parents=True)
    assert resolve_data(None)["root"] == tmp_path / "coco128"


def _official_batch_shapes(hw: np.ndarray, batch: int, img: int, stride: int = 32, pad: float = 0.5):
    """The official validator's rectangular batches, from its definition (sorted h/w, shape per batch)."""
    ar = hw[:, 0] / hw[:, 1]
    order = ar.argsort()
    ar = ar[order]
    shapes = []
    for k in range(0, len(ar), batch):
        lo, hi = ar[k : k + batch].min(), ar[k : k + batch].max()
        shapes.append([hi, 1] if hi < 1 else [1, 1 / lo] if lo > 1 else [1, 1])
    return order, np.ceil(np.array(shapes) * img / stride + pad).astype(int) * stride


def test_rect_batches_equal_the_official_definition(tmp_path):
    from PIL import Image

    from yolov9.train.data.dataset import RectBatchSampler

    sizes = [
        (640, 480),
        (480, 640),
        (500, 500),
        (640, 360),
        (300, 640),
        (640, 427),
        (427, 640),
        (612, 600),
        (640, 200),
    ]  # distinct aspects
    (tmp_path / "images").mkdir()
    for k, (w, h) in enumerate(sizes):
        Image.new("RGB", (w, h), (k * 20, 90, 160)).save(tmp_path / "images" / f"{k:02d}.jpg")
    (tmp_path / "d.yaml").write_text("path: .\ntrain: images\nnames: [a]\n")
    ds = DetectionDataset(load_split(resolve_data(tmp_path / "d.yaml"), "val"), 320)
    sampler = RectBatchSampler(ds, 4)
    order, shapes = _official_batch_shapes(np.array([(h, w) for w, h in sizes], float), 4, 320)
    assert [i for b in sampler.batches for i in b] == order.tolist()
    for k, b in enumerate(sampler.batches):
        assert {sampler.shapes[i] for i in b} == {tuple(shapes[k])}
    loader = eval_loader(ds, 4, rect=True)
    for batch in loader:  # every image of a batch in its batch's shape, boxes mapped back
        assert tuple(batch.images.shape[2:]) == sampler.shapes[int(batch.indices[0])]
        assert all(m.ratio <= 1.0 for m in batch.metas)
    square = next(iter(eval_loader(ds, 4)))  # a later plain loader is square again
    assert tuple(square.images.shape[2:]) == (320, 320)
