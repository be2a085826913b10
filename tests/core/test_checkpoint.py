"""Checkpoint formats: conversion, our own format under weights_only, and hostile or broken files."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from tests.conftest import rel_l2
from yolov9.core.checkpoint import CheckpointError, convert, load_model, read_checkpoint, save_checkpoint


def test_convert_then_load_with_weights_only(interop, tmp_path):
    out = convert(interop / "yolov9-s.pt", tmp_path / "ours.pt")
    raw = torch.load(out, weights_only=True)  # plain torch, no allowlist: no pickled classes inside
    assert raw["format"] == "yolov9-trt" and raw["cfg"]["name"] == "yolov9-s" and len(raw["names"]) == 80
    ref = np.load(interop / "yolov9-s.ref.npz")
    model = load_model(out)
    with torch.no_grad():
        pred = model(torch.from_numpy(ref["images"]))
    assert rel_l2(pred[1], torch.from_numpy(ref["pred1"])) < 1e-4
    assert model.names[0] == "person"


class _Evil:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_malicious_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"model": _Evil(marker), "epoch": -1}, path)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(path)
    msg = str(e.value)
    assert "posix.system" in msg or "os.system" in msg
    assert "\n" not in msg
    assert not marker.exists()


def test_global_smuggled_into_an_official_looking_pickle(tmp_path):
    """A raw protocol-2 pickle that names builtins.eval inside a torch zip archive."""
    payload = b"\x80\x02cbuiltins\neval\nq\x00X\x0b\x00\x00\x00print('hi')q\x01\x85q\x02Rq\x03."
    path = tmp_path / "crafted.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("crafted/data.pkl", payload)
        z.writestr("crafted/byteorder", "little")
        z.writestr("crafted/version", "3\n")
    with pytest.raises(CheckpointError, match="references .eval."):
        read_checkpoint(path)


def test_truncated_and_foreign_files_give_one_line(interop, tmp_path):
    cut = tmp_path / "cut.pt"
    cut.write_bytes((interop / "gelan-c.pt").read_bytes()[:100_000])
    txt = tmp_path / "notes.pt"
    txt.write_text("hello")
    data = io.BytesIO()
    pickle.dump({"x": 1}, data)
    with pytest.raises(CheckpointError) as e1:
        read_checkpoint(cut)
    with pytest.raises(CheckpointError) as e2:
        read_checkpoint(txt)
    for e in (e1, e2):
        assert "\n" not in str(e.value)
    no_model = tmp_path / "nomodel.pt"
    torch.save({"weights": torch.zeros(2)}, no_model)
    with pytest.raises(CheckpointError, match="not a YOLOv9 checkpoint"):
        read_checkpoint(no_model)


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00" * 64)
    r = subprocess.run(
        [sys.executable, "-m", "yolov9", "convert", str(bad), str(tmp_path / "o.pt")], capture_output=True, text=True
    )
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "bad.pt" in r.stderr and "Traceback" not in r.stderr


def test_info_cli_prints_params_and_gflops(interop):
    r = subprocess.run(
        [sys.executable, "-m", "yolov9", "info", str(interop / "gelan-c.pt")],
        capture_output=True,
        text=True,
        check=True,
    )
    last = next(x for x in r.stdout.splitlines() if "parameters," in x)
    assert "25,498,752 parameters" in last and "GFLOPs at 640" in last
    gflops = float(last.split("parameters, ")[1].split(" GFLOPs")[0])
    assert 95 < gflops < 110  # official summary: 103.5


_OFFICIAL_NAMES = {"Detect": "models.yolo.DDetect"}  # every other block keeps its name, under models.common


def _as_official(model: torch.nn.Module) -> torch.nn.Module:
    """Our model re-labelled with the official class paths (models.yolo / models.common), pickled as the official
    trainer pickles its DetectionModel: a layer config under `yaml`, class names, the layers under `model`."""
    import types

    for mod in ("models", "models.yolo", "models.common"):
        sys.modules.setdefault(mod, types.ModuleType(mod))
    for m in model.modules():
        cls = type(m)
        if isinstance(m, torch.nn.Upsample):  # ours subclasses it; the official files hold torch's own
            m.__class__ = torch.nn.Upsample
        if cls.__module__.startswith("torch.") or isinstance(m, torch.nn.Upsample):
            continue
        path = (
            "models.yolo.DetectionModel"
            if m is model
            else _OFFICIAL_NAMES.get(cls.__name__, f"models.common.{cls.__name__}")
        )
        module, name = path.rsplit(".", 1)
        twin = getattr(sys.modules[module], name, None)
        if twin is None:
            twin = type(name, (cls,), {"__module__": module, "__qualname__": name})
            setattr(sys.modules[module], name, twin)
        m.__class__ = twin
    model.yaml = model.cfg
    return model


def test_unstripped_official_checkpoint_with_numpy_scalars_loads(tmp_path):
    """An interrupted official run's last.pt: model and EMA as fp16 modules, optimizer state, numpy scalars."""
    import copy

    from yolov9.core.model import DetectionModel

    torch.manual_seed(0)
    ours = DetectionModel("gelan-t").train()
    opt = torch.optim.SGD(ours.parameters(), lr=0.01, momentum=0.9)
    sum(f.float().mean() for f in ours(torch.rand(2, 3, 64, 64))).backward()
    opt.step()  # momentum buffers in the optimizer state, as after real steps
    ours.eval()
    ema = _as_official(copy.deepcopy(ours)).half()
    ckpt = {
        "epoch": 7,
        "best_fitness": np.float64(0.3125),
        "model": _as_official(copy.deepcopy(ours)).half(),
        "ema": ema,
        "updates": 812,
        "optimizer": opt.state_dict(),
        "opt": {"batch_size": 16, "imgsz": 640, "lr_scale": np.float32(0.5), "hyp": {"lr0": np.float64(0.01)}},
        "git": {"commit": "5b1ea9a"},
        "date": "2026-11-30T12:00:00",
    }
    path = tmp_path / "last.pt"
    torch.save(ckpt, path)
    got = read_checkpoint(path)
    assert got["meta"]["epoch"] == 7
    loaded = load_model(path)
    x = torch.rand(1, 3, 96, 96)
    assert rel_l2(loaded(x), ours.half().float()(x)) < 1e-6


def test_numpy_arrays_and_other_numpy_globals_stay_refused(tmp_path):
    """Only numpy's scalar and dtype classes are allowed: an array rebuild (numpy's _reconstruct) is refused."""
    path = tmp_path / "arr.pt"
    torch.save({"model": None, "x": np.zeros(3)}, path)
    with pytest.raises(CheckpointError, match="_reconstruct|refused"):
        read_checkpoint(path)


def test_a_failed_checkpoint_write_names_the_file_keeps_the_old_one_and_leaves_no_partial(tmp_path):
    """A real failing write (the process's file size limit stops it part-way, as a full disk does): one line that
    says which file and why, the previous checkpoint unchanged, no .tmp left behind."""
    import subprocess
    import sys
    import textwrap

    from yolov9.core.model import DetectionModel

    path = tmp_path / "last.pt"
    save_checkpoint(path, DetectionModel("gelan-t"), {"epoch": 1})
    before = path.read_bytes()
    code = textwrap.dedent(
        f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        from yolov9.core.checkpoint import save_checkpoint
        from yolov9.core.model import DetectionModel
        from yolov9.core.errors import UsageError
        try:
            save_checkpoint({str(path)!r}, DetectionModel("gelan-s"), {{"epoch": 2}})
        except UsageError as e:
            print(e)
            sys.exit(3)
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 3, run.stderr
    assert f"could not write {path}: the process's file size limit (ulimit -f) is 1 MiB" in run.stdout
    assert "the previous last.pt is unchanged" in run.stdout
    assert path.read_bytes() == before
    assert not path.with_suffix(".pt.tmp").exists()
