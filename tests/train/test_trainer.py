"""The training loop on CPU: loss falls, resume is exact, outputs land in the run folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import LIGHT_HYP, tiny_train_config
from train.trainer import TrainConfig, Trainer


@pytest.fixture(scope="module")
def subset(tiny_subset) -> Path:
    """The shared 16-image coco48 subset, through a dataset YAML with names of its own."""
    yaml_path = tiny_subset / "data.yaml"
    names = ", ".join(f"c{i}" for i in range(80))
    yaml_path.write_text(f"path: .\ntrain: images\nval: images\nnames: [{names}]\n")
    return yaml_path


def _cfg(data, tmp, **kw) -> TrainConfig:
    return tiny_train_config(data, tmp, **kw)


def _rows(run_dir) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "results.jsonl").read_text().splitlines()]


def test_loss_falls_and_outputs_are_written(subset, tmp_path):
    summary = Trainer(_cfg(subset, tmp_path, epochs=12, batch=4, nbs=4, name="fall", val=True, val_interval=12)).fit()
    rows = _rows(summary["run_dir"])
    total = [r["box"] + r["cls"] + r["dfl"] for r in rows]
    assert total[-1] < 0.85 * total[0], total
    run = Path(summary["run_dir"])
    for f in (
        "weights/last.pt",
        "weights/best.pt",
        "results.csv",
        "results.png",
        "args.yaml",
        "data_problems.txt",
        "val_per_class.txt",
    ):
        assert (run / f).exists(), f
    assert "map" in rows[-1] and 0.0 <= rows[-1]["map"] <= 1.0
    assert summary["skipped_steps"] == 0


def test_resume_continues_exactly(subset, tmp_path):
    full = Trainer(_cfg(subset, tmp_path, epochs=3, name="full")).fit()
    part = Trainer(_cfg(subset, tmp_path, epochs=3, name="part", stop_after=2)).fit()
    assert [r["epoch"] for r in _rows(part["run_dir"])] == [0, 1]
    resumed = Trainer(TrainConfig(resume=part["run_dir"], workers=0, device="cpu")).fit()
    a, b = _rows(full["run_dir"]), _rows(resumed["run_dir"])
    assert [r["epoch"] for r in b] == [0, 1, 2]
    for key in ("box", "cls", "dfl"):
        assert b[2][key] == pytest.approx(a[2][key], rel=1e-5), key


def test_resume_during_warmup(subset, tmp_path):
    """Warm-up writes LR and momentum into the optimizer state; the checkpoint must stay weights_only-readable."""
    part = Trainer(
        _cfg(subset, tmp_path, epochs=2, name="warm", stop_after=1, hyp={**LIGHT_HYP, "warmup_epochs": 3.0})
    ).fit()
    resumed = Trainer(TrainConfig(resume=part["run_dir"], workers=0, device="cpu")).fit()
    assert [r["epoch"] for r in _rows(resumed["run_dir"])] == [0, 1]


def test_fine_tune_from_official_weights_with_new_classes(subset, interop, tmp_path):
    """--weights from an official checkpoint into a 80-class dataset keeps every tensor."""
    cfg = _cfg(subset, tmp_path, epochs=1, name="ft", weights=str(interop / "gelan-c.pt"), img=64, batch=4, nbs=4)
    summary = Trainer(cfg).fit()
    assert len(_rows(summary["run_dir"])) == 1


def test_train_cli_help_explains_every_flag():
    out = subprocess.run(
        [sys.executable, "-m", "yolov9", "train", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in ("--data", "--cfg", "--amp", "--cache", "--close-mosaic", "--resume", "--nbs", "--batch"):
        assert flag in out


def test_bench_train_reports_each_amp_mode(tmp_path):
    out = tmp_path / "bench.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "yolov9",
            "bench",
            "train",
            "--cfg",
            "gelan-t",
            "--data",
            "coco48",
            "--img",
            "96",
            "--batch",
            "4",
            "--amp",
            "off,bf16",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--workers",
            "1",
            "--cache",
            "none",
            "--device",
            "cpu",
            "--out",
            str(out),
            "--profile",
            str(tmp_path / "profile.txt"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    rows = json.loads(out.read_text())
    assert [r["amp"] for r in rows] == ["off", "bf16"]
    assert all(r["images_per_s"] > 0 and 0 <= r["data_wait_share"] <= 1 for r in rows)
    assert all(r["aten_ops_per_step"] > 100 for r in rows)  # a real forward/backward/optimizer step ran
    assert "aten::convolution" in (tmp_path / "profile.txt").read_text()
    # training FLOPs: forward plus backward, about three forwards (no input gradient for the first layer)
    from torch.utils.flop_counter import FlopCounterMode

    from core.model import DetectionModel

    model = DetectionModel("gelan-t", nc=80).train()
    with FlopCounterMode(display=False) as fwd, torch.no_grad():
        model(torch.zeros(2, 3, 96, 96))
    ratio = rows[0]["train_gflop_per_image"] * 1e9 / (fwd.get_total_flops() / 2)
    assert 2.5 < ratio < 3.1, ratio
    assert rows[0]["mfu"] is None and rows[0]["warmup_s"] > 0


def test_failed_setup_leaves_no_run_folder_and_keeps_latest(tmp_path, capsys):
    project = tmp_path / "runs"
    (project / "exp").mkdir(parents=True)
    (project / "latest").symlink_to("exp")
    bad = tmp_path / "bad.yaml"
    bad.write_text("path: .\ntrain: images/missing\nnames: [a]\n")
    with pytest.raises(FileNotFoundError, match="train: images/missing"):
        Trainer(_cfg(bad, project, epochs=1, name="broken")).fit()
    assert sorted(p.name for p in project.iterdir()) == ["exp", "latest"]
    assert (project / "latest").readlink() == Path("exp")
    r = subprocess.run(
        [sys.executable, "-m", "yolov9", "train", "--data", str(bad), "--project", str(project), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "bad.yaml" in r.stderr, r.stderr
    assert sorted(p.name for p in project.iterdir()) == ["exp", "latest"]


def test_trainer_prints_what_each_split_holds(subset, tmp_path, capsys):
    Trainer(_cfg(subset, tmp_path, epochs=1, val=True))
    out = capsys.readouterr().out
    assert "train: 16 images (0 background)" in out and "val: 16 images" in out and "80 classes" in out


def test_every_help_names_each_default_once():
    """Every flag of every subcommand has a help text, and none shows its default twice."""
    from yolov9.cli import HelpFormatter, _all_parsers, build_parser

    for parser in _all_parsers(build_parser()):
        fmt = HelpFormatter(parser.prog)
        for action in parser._actions:
            if not action.option_strings or action.help == "==SUPPRESS==" or "-h" in action.option_strings:
                continue
            assert action.help, f"{parser.prog} {action.option_strings[0]} has no help"
            text = fmt._get_help_string(action) % {"default": action.default}
            assert text.count("(default") <= 1, f"{parser.prog} {action.option_strings[0]}: {text}"
    out = subprocess.run(
        [sys.executable, "-m", "yolov9", "train", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "200"},  # one line per flag
    ).stdout
    assert "(default: yolov9-s)" in out and out.count("(default: 640)") == 1


def test_cuda_graphs_are_the_default_and_the_cpu_trains_eagerly(subset, tmp_path):
    from train.graphed_step import GraphedStep

    trainer = Trainer(_cfg(subset, tmp_path, epochs=1))
    assert trainer.cfg.cuda_graph
    trainer.fit()
    assert not trainer.step.graphs and trainer.step.captures == 0
    with pytest.raises(ValueError, match="--cuda-graph needs one CUDA GPU"):
        GraphedStep(trainer.model, trainer.loss_fn, None, trainer.scaler)


def test_dual_head_model_trains_and_validates(subset, tmp_path):
    """yolov9 models validate on their main head (eval mode gives [auxiliary, main])."""
    summary = Trainer(_cfg(subset, tmp_path, cfg="yolov9-t", img=64, epochs=1, name="dual", val=True)).fit()
    row = _rows(summary["run_dir"])[-1]
    assert 0.0 <= row["map"] <= 1.0 and (Path(summary["run_dir"]) / "val_per_class.txt").exists()
