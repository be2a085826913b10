"""Export: ONNX (raw and end-to-end NMS) against PyTorch through ONNX Runtime, the engine interface, val on an
engine, AOTInductor packages, and TensorRT where it exists."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from tests.conftest import AOTI_TEST_OPTIONS, rel_l2, requires_cuda
from yolov9.core.checkpoint import load_model, save_checkpoint
from yolov9.core.decode import decode_image
from yolov9.core.detection_defaults import Thresholds
from yolov9.core.model import DetectionModel
from yolov9.core.postprocess import nms_flat, per_image
from yolov9.core.preprocess import prepare_batch, to_input
from yolov9.export.engine import engine_spec, load_engine
from yolov9.export.onnx_export import OnnxEngine, export_onnx
from yolov9.export.torch_engine import TorchEngine


def _coco_batch(coco48, n=4, size=320):
    files = sorted((coco48 / "images").glob("*.jpg"))[:n]
    batch, _ = prepare_batch([decode_image(f) for f in files], size)
    return to_input(batch)


@pytest.mark.parametrize("weights", ["gelan-s", "yolov9-s-official"])
def test_onnx_matches_pytorch(weights, interop, tmp_path, coco48):
    if weights == "gelan-s":
        torch.manual_seed(0)
        src = tmp_path / "gelan-s.pt"
        save_checkpoint(src, DetectionModel("gelan-s"))
    else:
        src = interop / "yolov9-s.pt"  # training model: exported as its re-parameterized GELAN form
    out = export_onnx(load_model(src), tmp_path / "m.onnx", img=320)
    proto = onnx.load(str(out))
    onnx.checker.check_model(proto)
    assert proto.opset_import[0].version >= 17
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["end2end"] == "false" and len(eval(meta["names"])) == 80  # noqa: S307 - our own JSON list
    x = _coco_batch(coco48, 3)
    ref = TorchEngine(load_model(src))(x)
    got = OnnxEngine(out)(x)
    assert got.shape == (3, 84, 2100)
    assert rel_l2(got, ref) < 1e-4
    if weights != "gelan-s":  # the ONNX graph reproduces the official main head too
        ref_npz = np.load(interop / "yolov9-s.ref.npz")
        assert rel_l2(OnnxEngine(out)(torch.from_numpy(ref_npz["images"])), torch.from_numpy(ref_npz["pred1"])) < 1e-4


def test_end2end_nms_graph_equals_pytorch_nms(trained_tiny, tmp_path, coco48):
    conf, iou = 0.05, 0.45
    out = export_onnx(load_model(trained_tiny), tmp_path / "e2e.onnx", img=160, nms=Thresholds(conf, iou, 100))
    eng = OnnxEngine(out, allow_end2end=True)
    x = _coco_batch(coco48, 8, 160)
    num, boxes, scores, classes = eng.run_end2end(x)
    assert num.shape == (8, 1) and boxes.shape == (8, 100, 4) and scores.shape == (8, 100)
    ref = per_image(nms_flat(TorchEngine(load_model(trained_tiny))(x), conf, iou, 100))
    assert sum(len(r) for r in ref) > 0
    for i, r in enumerate(ref):
        n = int(num[i, 0])
        got = torch.cat((boxes[i, :n], scores[i, :n, None], classes[i, :n, None].float()), 1)
        clear = r[r[:, 4] > conf * 1.05]  # detections not sitting on the threshold must all be there
        for det in clear:
            match = (got[:, 5] == det[5]) & ((got[:, :4] - det[:4]).abs().max(1).values < 1e-2)
            assert match.any(), (i, det)
        assert abs(n - len(r)) <= max(1, len(r) // 20)
        assert torch.all(scores[i, n:] == 0) and torch.all(boxes[i, n:] == 0)


class _TiedScores(torch.nn.Module):
    """Two anchors: the first scores 0.6 for classes 0 and 1 alike (a tie), the second 0.3 for class 0."""

    def forward(self, x):
        pred = torch.tensor([[[10.0, 50.0], [10.0, 50.0], [4.0, 4.0], [4.0, 4.0], [0.6, 0.3], [0.6, 0.1]]])
        return pred.expand(x.shape[0], -1, -1) + x.mean() * 0


def test_end2end_nms_keeps_a_tied_anchor_once(tmp_path):
    import onnxruntime as ort

    from yolov9.export.onnx_export import End2End

    path = tmp_path / "tied.onnx"
    net = End2End(_TiedScores(), 0.25, 0.45, 10)
    torch.onnx.export(net, torch.zeros(1, 3, 8, 8), str(path), input_names=["images"], dynamo=False)
    num, _, scores, classes = ort.InferenceSession(str(path)).run(None, {"images": np.zeros((1, 3, 8, 8), np.float32)})
    assert int(num[0, 0]) == 2
    np.testing.assert_allclose(scores[0, :2], [0.6, 0.3], rtol=1e-6)
    assert classes[0, :2].tolist() == [0, 0]


def test_engine_interface_same_results_for_torch_and_onnx(trained_tiny, tmp_path, coco48):
    onnx_path = export_onnx(load_model(trained_tiny), tmp_path / "t.onnx", img=160)
    x = _coco_batch(coco48, 4, 160)
    a, b = load_engine(trained_tiny, device="cpu")(x), load_engine(onnx_path)(x)
    assert rel_l2(b, a) < 1e-4
    da, db = per_image(nms_flat(a, 0.05)), per_image(nms_flat(b, 0.05))
    assert [len(d) for d in da] == [len(d) for d in db]
    weights = tmp_path / "w.pt"
    shutil.copy(trained_tiny, weights)
    assert load_engine(engine_spec("auto", str(weights)), device="cpu").kind == "torch"  # nothing exported yet
    shutil.copy(onnx_path, weights.with_suffix(".onnx"))
    assert load_engine(engine_spec("auto", str(weights)), device="cpu").kind == "onnx"  # ORT beats torch on CPU


def test_val_on_onnx_engine_gives_pytorch_map(trained_tiny, tmp_path, tiny_subset):
    onnx_path = export_onnx(load_model(trained_tiny), tmp_path / "v.onnx", img=160)
    maps = []
    # PyTorch weights are scored in the official protocol unless told otherwise; an ONNX engine as it is served
    for spec in ([str(trained_tiny), "--square", "--single-label"], [str(onnx_path)]):
        out = tmp_path / f"{len(maps)}.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "yolov9",
                "val",
                *spec,
                "--data",
                str(tiny_subset),
                "--img",
                "160",
                "--device",
                "cpu",
                "--workers",
                "0",
                "--out",
                str(out),
            ],
            check=True,
            capture_output=True,
        )
        maps.append(__import__("json").loads(out.read_text()))
    assert maps[0]["map"] > 0.01  # the tiny model has learned something, so the comparison means something
    assert maps[1]["map"] == pytest.approx(maps[0]["map"], abs=2e-3)
    assert maps[0]["protocol"] == maps[1]["protocol"] and maps[0]["protocol"].startswith("deployment")
    assert maps[1]["map50"] == pytest.approx(maps[0]["map50"], abs=2e-3)


def test_export_trt_without_tensorrt_says_how_to_install(tmp_path):
    try:
        import tensorrt  # noqa: F401

        pytest.skip("TensorRT is installed here")
    except ImportError:
        pass
    r = subprocess.run(
        [sys.executable, "-m", "yolov9", "export", "trt", "gelan-t", "-o", str(tmp_path / "m.plan")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "pip install tensorrt" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.slow
def test_aoti_cpu_package_loads_and_matches(aoti_cpu_package, trained_tiny, tmp_path, coco48, monkeypatch):
    """AOTInductor on the CPU (the GPU fp16 package is tested on the GPU below)."""
    pt2 = aoti_cpu_package
    eng = load_engine(pt2, device="cpu")
    x = _coco_batch(coco48, 3, 160)
    got = eng(x)
    assert rel_l2(got, TorchEngine(load_model(trained_tiny))(x)) < 1e-4
    meta = json.loads(pt2.with_name("m.pt2.json").read_text())
    # the fixture's --inductor option reached the compile
    assert meta["extra"]["inductor_configs"] == {k: repr(v) for k, v in AOTI_TEST_OPTIONS.items()}
    if sys.platform.startswith("linux"):  # built through the g++ front: the library uses the shared C++ runtime
        assert meta["extra"]["links_shared_cxx_runtime"] is True
    # torch's own package loader runs the same library as our direct runner (the default)
    monkeypatch.setenv("YOLOV9_AOTI_LOADER", "package")
    assert torch.equal(load_engine(pt2, device="cpu")(x), got)
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    monkeypatch.setenv("YOLOV9_AOTI_LOADER", "runner")
    with pytest.raises(ValueError, match="not an AOTInductor package"):
        load_engine(bad, device="cpu")


_REGEX_LIB = """#include <regex>
#include <string>
extern "C" int parse(const char* s) {
  std::smatch m;
  std::string str(s);
  return std::regex_match(str, m, std::regex("(cuda|cpu)(:([0-9]+))?")) ? 1 : 0;
}
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("g++") is None, reason="the g++ front is for Linux + g++"
)
def test_cxx_front_links_the_shared_cxx_runtime(tmp_path):
    """The H200 AOTI crash in miniature: a library with its own static C++ runtime, loaded next to PyTorch's
    libstdc++, breaks std::regex. Built through the export's g++ front, the same flags give a library that needs
    libstdc++.so and works in a process that has torch loaded."""
    from yolov9.export.aoti import elf_needs_libstdcxx, write_cxx_front

    src = tmp_path / "rx.cpp"
    src.write_text(_REGEX_LIB)
    flags = ["-shared", "-fPIC", "-O1", "-static-libstdc++", "-static-libgcc"]
    plain, fronted = tmp_path / "plain.so", tmp_path / "fronted.so"
    subprocess.run(["g++", *flags, "-o", plain, src], check=True)
    subprocess.run([write_cxx_front(tmp_path, shutil.which("g++")), *flags, "-o", fronted, src], check=True)
    assert elf_needs_libstdcxx(plain.read_bytes()) is False
    assert elf_needs_libstdcxx(fronted.read_bytes()) is True
    code = f"import ctypes, torch; print(ctypes.CDLL({str(fronted)!r}).parse(b'cuda:0'))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "1", run.stderr[-500:]


def test_inductor_option_flags_parse_as_python_literals():
    from yolov9.export.cli import _inductor_configs

    got = _inductor_configs(["aot_inductor.package_constants_in_so=False", "max_autotune=True", "mode=default"])
    assert got == {"aot_inductor.package_constants_in_so": False, "max_autotune": True, "mode": "default"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        _inductor_configs(["max_autotune"])


def test_cuda_packages_default_to_frozen_channels_last():
    import torch._inductor.config as inductor_config

    from yolov9.export.aoti import CUDA_DEFAULTS, inductor_options

    # both keys must still be Inductor options in this torch (a rename would silently drop the speed-up)
    assert all(hasattr(inductor_config, k) for k in CUDA_DEFAULTS)
    assert inductor_options("cuda:0") == {"freezing": True, "force_layout_optimization": True}
    assert inductor_options("cuda", {"freezing": False, "max_autotune": True}) == {
        "freezing": False,
        "force_layout_optimization": True,
        "max_autotune": True,
    }
    assert inductor_options("cpu") == {} and inductor_options("cpu", {"freezing": True}) == {"freezing": True}


@requires_cuda
def test_aoti_cuda_fp16_matches_fp32(trained_tiny, tmp_path, coco48):
    from yolov9.export.aoti import export_aoti

    pt2 = export_aoti(trained_tiny, tmp_path / "m.pt2", img=160, max_batch=16)
    x = _coco_batch(coco48, 8, 160).cuda()
    got = load_engine(pt2)(x)
    ref = TorchEngine(load_model(trained_tiny), "cuda")(x)
    assert rel_l2(got, ref) < 5e-3


def _has_tensorrt() -> bool:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(
    not _has_tensorrt(),
    reason="TensorRT is not installed here (it cannot be installed on our machines) or there is no CUDA GPU",
)
def test_tensorrt_engine_builds_and_matches_onnx(trained_tiny, tmp_path, coco48):
    from yolov9.export.tensorrt import BuildProfile, TensorRTEngine, build_engine, needs_fp16_onnx

    onnx_path = export_onnx(load_model(trained_tiny), tmp_path / "t.onnx", img=160, half=needs_fp16_onnx())
    plan = build_engine(onnx_path, tmp_path / "t.plan", BuildProfile(1, 4, 8, 1.0, tmp_path / "cache"))
    assert (tmp_path / "cache").exists() and plan.with_name(plan.name + ".json").exists()
    x = _coco_batch(coco48, 4, 160)
    got = TensorRTEngine(plan)(x.cuda()).cpu()
    ref = OnnxEngine(onnx_path)(x)
    assert rel_l2(got, ref) < 5e-3


def test_predict_cli_prints_json_and_saves_annotated_images(trained_tiny, tmp_path, coco48):
    import json

    from PIL import Image

    imgs = sorted((coco48 / "images").glob("*.jpg"))[:2]
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "yolov9",
            "predict",
            str(trained_tiny),
            *map(str, imgs),
            str(bad),
            "--img",
            "160",
            "--conf",
            "0.05",
            "--device",
            "cpu",
            "--project",
            str(tmp_path),
            "--save-txt",
            "--save-conf",
            "--save-crop",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    rows = [json.loads(x) for x in out if x.startswith("{")]
    assert [Path(r["image"]).name for r in rows] == [imgs[0].name, imgs[1].name, "broken.jpg"]
    assert rows[0]["detections"] and "error" in rows[2]
    w, h = Image.open(imgs[0]).size
    assert all(
        0 <= d["box"][0] <= d["box"][2] <= w and 0 <= d["box"][1] <= d["box"][3] <= h for d in rows[0]["detections"]
    )
    run = tmp_path / "predict"
    assert Image.open(run / imgs[0].name).size == (w, h)
    labels = (run / "labels" / f"{imgs[0].stem}.txt").read_text().splitlines()
    assert len(labels) == len(rows[0]["detections"]) and all(len(x.split()) == 6 for x in labels)
    first = rows[0]["detections"][0]
    cls, xc, yc, bw, bh, score = labels[0].split()
    assert int(cls) == first["class_id"] and float(score) == pytest.approx(first["score"], abs=1e-4)
    assert float(xc) * w == pytest.approx((first["box"][0] + first["box"][2]) / 2, abs=0.01)
    crops = list((run / "crops").rglob("*.jpg"))
    assert len(crops) >= len(rows[0]["detections"]) and (run / "crops" / first["class_name"]).is_dir()


def test_predict_numbers_its_runs_and_reads_videos(trained_tiny, tmp_path, coco48):
    import cv2

    frames = [cv2.resize(cv2.imread(str(p)), (320, 240)) for p in sorted((coco48 / "images").glob("*.jpg"))[:3]]
    video = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 5, (320, 240))
    for f in frames:
        writer.write(f)
    writer.release()
    args = ["predict", str(trained_tiny), str(video), "--img", "160", "--conf", "0.05", "--device", "cpu"]
    for _ in range(2):
        r = _cli(*args, "--project", str(tmp_path / "runs"))
        assert r.returncode == 0, r.stderr
    rows = [__import__("json").loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert [x["frame"] for x in rows] == [0, 1, 2] and all(x["video"] == str(video) for x in rows)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["predict", "predict2"]
    saved = cv2.VideoCapture(str(tmp_path / "runs" / "predict2" / "clip.mp4"))
    assert int(saved.get(cv2.CAP_PROP_FRAME_COUNT)) == 3


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yolov9", *args], capture_output=True, text=True, timeout=timeout)


def test_export_lands_beside_the_weights_and_val_runs_each_engine_at_its_size(trained_tiny, tmp_path):
    """A 160 px model: export writes best.onnx beside best.pt at the trained size, `val --engine auto` finds it and
    scores it at 160 px on the data the checkpoint was trained on (no --data), as PyTorch does."""
    import shutil

    weights = tmp_path / "best.pt"
    shutil.copy(trained_tiny, weights)
    r = _cli("export", "onnx", str(weights))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "best.onnx").exists() and (tmp_path / "best.onnx.json").exists()
    assert json.loads((tmp_path / "best.onnx.json").read_text())["img_size"] == 160
    maps = {}
    for engine, extra in (("auto", []), (str(weights), ["--square", "--single-label"]), (str(weights), [])):
        r = _cli("val", str(weights), "--engine", engine, "--device", "cpu", "--workers", "0", *extra)
        assert r.returncode == 0, r.stderr
        assert "(the dataset best.pt was trained on" in r.stdout and "val: 16 images" in r.stdout
        line = r.stdout.strip().splitlines()[-1]
        assert "at 160 px" in line, line
        maps[(line.split()[1], line.split(", ")[1].split()[0])] = float(line.split("mAP50-95")[1].split()[0])
    # ONNX runs in the deployment protocol; PyTorch in the official one unless told --square --single-label
    assert set(maps) == {("onnx", "deployment"), ("torch", "deployment"), ("torch", "official")}, maps
    assert maps["onnx", "deployment"] > 0.05
    assert maps["onnx", "deployment"] == pytest.approx(maps["torch", "deployment"], abs=0.01)
    r = _cli("val", str(tmp_path / "best.onnx"), "--img", "320", "--device", "cpu")
    assert r.returncode == 2 and "exported for 160 px, not 320" in r.stderr
    # one table: the engines beside the weights in the deployment protocol, and PyTorch in the official one
    out = tmp_path / "table.json"
    r = _cli(
        "val", str(weights), "--engines", "torch-fp32,onnx,aoti", "--device", "cpu", "--workers", "0", "--out", str(out)
    )
    assert r.returncode == 0, r.stderr
    assert "aoti: skipped (no best.pt2 beside the weights" in r.stdout
    rows = {(x["engine"], x["protocol"]): x for x in json.loads(out.read_text())}
    assert set(rows) == {("torch-fp32", "deployment"), ("onnx", "deployment"), ("torch-fp32-official", "official")}
    # the single-engine runs above print 4 decimals
    assert rows["onnx", "deployment"]["map"] == pytest.approx(maps["onnx", "deployment"], abs=1e-4)
    assert rows["torch-fp32", "deployment"]["map"] == pytest.approx(maps["torch", "deployment"], abs=1e-4)
    assert rows["torch-fp32-official", "official"]["map"] == pytest.approx(maps["torch", "official"], abs=1e-4)
    assert all(x["images_per_s"] > 0 for x in rows.values())


def test_end2end_onnx_in_val_and_predict_is_a_one_line_error(trained_tiny, tmp_path):
    e2e = tmp_path / "e2e.onnx"
    assert _cli("export", "onnx", str(trained_tiny), "--end2end", "-o", str(e2e)).returncode == 0
    for cmd in (["val", str(e2e), "--device", "cpu"], ["predict", str(e2e), "--device", "cpu", "--no-save"]):
        r = _cli(*cmd)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "end-to-end" in lines[0], r.stderr


def test_engine_without_its_metadata_is_an_error_naming_the_file(trained_tiny, tmp_path):
    import zipfile

    out = export_onnx(load_model(trained_tiny), tmp_path / "m.onnx", img=160)
    (tmp_path / "m.onnx.json").unlink()  # an ONNX file carries the same metadata inside
    assert OnnxEngine(out).img_size == 160 and len(OnnxEngine(out).names) == 80
    package = tmp_path / "m.pt2"
    with zipfile.ZipFile(package, "w") as z:
        z.writestr("m/data/aotinductor/model/x.wrapper.so", b"")
    r = _cli("val", str(package), "--device", "cpu")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "m.pt2.json is missing" in lines[0], r.stderr


def test_the_readme_python_example_runs_as_written(trained_tiny, tmp_path):
    """In a folder where the quick start left its run (runs/train/latest), the README's Python block runs."""
    import re

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"<!-- python-example -->\n```python\n(.*?)```\n<!-- /python-example -->", readme, re.S).group(1)
    (tmp_path / "runs" / "train").mkdir(parents=True)
    (tmp_path / "runs" / "train" / "latest").symlink_to(trained_tiny.parents[1], target_is_directory=True)
    r = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    from yolov9.core.paths import sample_images

    lines = [x for x in r.stdout.splitlines() if x.startswith(str(sample_images()[0].parent))]
    assert len(lines) == len(sample_images()) and any("[('" in x for x in lines)  # names and scores printed


def test_val_matches_classes_by_name_or_refuses_data_the_model_cannot_know(trained_tiny, tmp_path, coco48):
    """80-class weights on a 2-class set in another order are scored by name, with a note; classes the model
    lacks are a one-line error."""
    import shutil

    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    keep = {0: 1, 2: 0}  # COCO person -> 1, car -> 0
    for img in sorted((coco48 / "images").glob("*.jpg"))[:16]:
        shutil.copy(img, tmp_path / "images" / img.name)
        lab = coco48 / "labels" / f"{img.stem}.txt"
        rows = [r.split() for r in lab.read_text().splitlines()] if lab.exists() else []
        kept = [" ".join([str(keep[int(r[0])]), *r[1:]]) for r in rows if int(r[0]) in keep]
        (tmp_path / "labels" / f"{img.stem}.txt").write_text("\n".join(kept) + "\n" if kept else "")
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images\nval: images\nnames: [car, person]\n")
    r = _cli("val", str(trained_tiny), "--data", str(tmp_path / "data.yaml"), "--img", "160", "--device", "cpu",
             "--workers", "0", "--square", "--single-label")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "note: the model's 80 classes and the data's 2 differ; matched by name" in r.stdout
    table = r.stdout[r.stdout.index("class ") :]
    assert "person" in table and "car" in table and "bowl" not in table
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images\nval: images\nnames: [car, pedestrian]\n")
    r = _cli("val", str(trained_tiny), "--data", str(tmp_path / "data.yaml"), "--img", "160", "--device", "cpu")
    assert r.returncode == 2 and "the data's classes pedestrian are not among the model's 80 classes" in r.stderr
    assert r.stderr.count("error:") == 1 and "Traceback" not in r.stderr, r.stderr


def test_predict_refuses_what_cannot_work_before_loading_the_engine(tmp_path, capfd):
    """Each is one line: an empty folder (nothing was predicted, silently), parameters out of range (no detections,
    silently), a size below the stride; a file named itself is read whatever its suffix, and reported if no image."""
    from yolov9.cli import main

    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not an image")
    cases = [
        ([str(tmp_path / "empty")], "no images or videos in this folder"),
        (["--conf", "5"], "conf 5.0 is not in [0, 1]"),
        (["--iou", "0"], "iou 0.0 is not in (0, 1]"),
        (["--max-det", "0"], "max_det 0 is not in [1, 1000]"),
        (["--img", "8"], "--img 8: must be at least 32"),
    ]
    for args, message in cases:
        code = main(["predict", "gelan-t", *args, "--device", "cpu", "--no-save"])
        err = capfd.readouterr().err
        assert code == 2 and message in err and "engine" not in err, (args, err)
    assert main(["predict", "gelan-t", str(tmp_path / "notes.txt"), "--device", "cpu", "--img", "64", "--no-save"]) == 0
    assert json.loads(capfd.readouterr().out.splitlines()[-1])["error"].startswith("not a decodable image")
    assert main(["bench", "train", "--cfg", "gelan-t", "--steps", "0", "--device", "cpu"]) == 2
    assert "--steps 0: must be at least 1" in capfd.readouterr().err


@pytest.mark.parametrize(
    "args,message",
    [
        (["val", "gelan-t", "--data", "coco128", "--conf", "2"], "conf 2.0 is not in [0, 1]"),
        (["val", "gelan-t", "--data", "coco128", "--batch", "0"], "--batch 0: must be at least 1"),
        (["export", "onnx", "gelan-t", "--img", "8"], "--img 8: must be at least 32"),
        (["export", "onnx", "gelan-t", "--end2end", "--iou", "2"], "iou 2.0 is not in (0, 1]"),
    ],
)
def test_val_and_export_refuse_what_cannot_work(args, message, capfd):
    from yolov9.cli import main

    assert main([*args, "--device", "cpu"]) == 2
    err = capfd.readouterr().err
    assert message in err and "Traceback" not in err, err


@pytest.mark.parametrize("name", ["junk.onnx", "junk.pt", "junk.pt2"])
def test_info_on_a_file_that_is_not_what_its_suffix_says_is_one_line(name, tmp_path, capfd):
    from yolov9.cli import main

    (tmp_path / name).write_bytes(b"\x08\x96\x01 not a model")
    assert main(["info", str(tmp_path / name)]) == 2
    err = capfd.readouterr().err.strip()
    assert name in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
