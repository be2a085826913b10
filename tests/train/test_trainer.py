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
from yolov9.core.errors import BadInput
from yolov9.train.trainer import TrainConfig, Trainer


@pytest.fixture(scope="module")
def subset(tiny_subset, tmp_path_factory) -> Path:
    """The shared 16-image coco48 subset, through a dataset YAML with names of its own, written beside the test
    rather than into the shared folder: there it would rename the classes of every later run on that folder
    (`trained_tiny`'s, when that fixture is first needed after these tests)."""
    yaml_path = tmp_path_factory.mktemp("subset") / "data.yaml"
    names = ", ".join(f"c{i}" for i in range(80))
    yaml_path.write_text(f"path: {tiny_subset}\ntrain: images\nval: images\nnames: [{names}]\n")
    return yaml_path


def _cfg(data, tmp, **kw) -> TrainConfig:
    return tiny_train_config(data, tmp, **kw)


def _rows(run_dir) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "results.jsonl").read_text().splitlines()]


def test_validation_lets_cudnn_pick_by_heuristics_in_a_run_that_times_it(subset, tmp_path, monkeypatch):
    """A run that times its step's convolutions (set by hand here: the CPU run leaves the flag alone) validates
    without timing validation's other shapes, and times again after."""
    import yolov9.train.trainer as trainer_module

    during = []

    def evaluate(*args, **kw):
        during.append(torch.backends.cudnn.benchmark)
        return real(*args, **kw)

    real = trainer_module.evaluate
    monkeypatch.setattr(trainer_module, "evaluate", evaluate)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    Trainer(_cfg(subset, tmp_path, epochs=2, batch=4, nbs=4, name="heur", val=True, val_interval=1)).fit()
    assert during == [False, False] and torch.backends.cudnn.benchmark is True


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
        "labels.jpg",
        "train_batch0.jpg",
        "train_batch2.jpg",
    ):
        assert (run / f).exists(), f
    assert "map" in rows[-1] and 0.0 <= rows[-1]["map"] <= 1.0
    # each epoch's end costs: validation (with its NMS and scoring, of so many detections) only where it ran, the
    # checkpoint
    last = rows[-1]
    assert last["val_s"] > last["nms_s"] + last["score_s"] and last["nms_s"] > 0 and last["score_s"] > 0
    assert last["detections"] >= 0
    assert all("val_s" not in r for r in rows[:-1]) and all(r["checkpoint_s"] >= 0 for r in rows)
    assert summary["skipped_steps"] == 0
    # the wait before training starts: the first epoch's first step, counted from the process's start
    assert rows[0]["start_to_first_step_s"] > rows[0]["first_step_s"] > rows[0]["first_batch_s"] > 0
    # and where that wait went: the set-up's stages in order, ending at the first step
    timeline = list(rows[0]["startup_s"].items())
    assert [k for k, _ in timeline] == [
        "imports", "model", "datasets", "step_setup", "epoch_start", "first_batch", "first_step"
    ]  # fmt: skip
    assert all(a <= b for (_, a), (_, b) in zip(timeline, timeline[1:])), timeline
    assert timeline[-1][1] == round(rows[0]["start_to_first_step_s"], 2)
    assert all("start_to_first_step_s" not in r and r["first_step_s"] > 0 for r in rows[1:])
    assert rows[0]["cudnn_benchmark"] is False and all("cudnn_benchmark" not in r for r in rows[1:])  # no GPU
    # the first step's own time in parts that add up to it: forward and backward, the optimizer, the GPU's tail
    for r in rows:
        parts = r["first_step_parts_s"]
        assert list(parts) == ["forward_backward", "optimizer", "gpu_wait"] and min(parts.values()) >= 0, parts
        assert parts["forward_backward"] > 0
        assert sum(parts.values()) == pytest.approx(r["first_step_s"] - r["first_batch_s"], abs=0.01)
    assert "first_step_allocations" not in rows[0]  # CUDA's allocations are counted on a GPU
    assert "compile_cache_misses" not in rows[0]  # nothing compiled on the CPU by default
    assert "prewarm_s" not in rows[0]  # the GPU warm-up runs on a GPU alone


def test_resume_continues_exactly(subset, tmp_path):
    full = Trainer(_cfg(subset, tmp_path, epochs=3, name="full")).fit()
    part = Trainer(_cfg(subset, tmp_path, epochs=3, name="part", stop_after=2)).fit()
    assert [r["epoch"] for r in _rows(part["run_dir"])] == [1, 2]
    resumed = Trainer(TrainConfig(resume=part["run_dir"], workers=0, device="cpu")).fit()
    a, b = _rows(full["run_dir"]), _rows(resumed["run_dir"])
    assert [r["epoch"] for r in b] == [1, 2, 3]
    for key in ("box", "cls", "dfl"):
        assert b[2][key] == pytest.approx(a[2][key], rel=1e-5), key


def test_resume_during_warmup(subset, tmp_path):
    """Warm-up writes LR and momentum into the optimizer state; the checkpoint must stay weights_only-readable."""
    part = Trainer(
        _cfg(subset, tmp_path, epochs=2, name="warm", stop_after=1, hyp={**LIGHT_HYP, "warmup_epochs": 3.0})
    ).fit()
    resumed = Trainer(TrainConfig(resume=part["run_dir"], workers=0, device="cpu")).fit()
    assert [r["epoch"] for r in _rows(resumed["run_dir"])] == [1, 2]


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


def test_bench_train_out_of_memory_is_one_line_after_the_json(tmp_path, monkeypatch, capfd):
    """A mode that runs out of memory (raised at the first step here: the CPU does not run out) ends the bench with
    one line naming the batch to lower; the JSON keeps a row saying so, and the modes after it do not run."""
    from yolov9.cli import main
    from yolov9.train.engine import TrainStep

    def no_memory(*_):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 50.00 MiB.")

    monkeypatch.setattr(TrainStep, "micro", no_memory)
    out = tmp_path / "bench.json"
    argv = ["bench", "train", "--cfg", "gelan-t", "--data", "coco48", "--img", "64", "--batch", "4"]
    argv += ["--amp", "off,bf16", "--workers", "1", "--cache", "none", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 2
    why = "out of memory training gelan-t at --batch 4 (off) on cpu; try a smaller --batch"
    assert capfd.readouterr().err.strip().splitlines()[-1] == f"yolov9 bench: error: {why}"
    assert json.loads(out.read_text()) == [{"amp": "off", "cfg": "gelan-t", "img": 64, "batch": 4, "error": why}]


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
    assert all(r["first_step_s"] > 0 and "compile_cache_hits" not in r for r in rows)  # nothing compiled
    assert all(r["aten_ops_per_step"] > 100 for r in rows)  # a real forward/backward/optimizer step ran
    assert "aten::convolution" in (tmp_path / "profile.txt").read_text()
    # training FLOPs: forward plus backward, about three forwards (no input gradient for the first layer)
    from torch.utils.flop_counter import FlopCounterMode

    from yolov9.core.model import DetectionModel

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


@pytest.mark.parametrize(
    "argv, hints",
    [
        (["train", "--batch-size", "8", "imgsz=320"], ["--batch-size is --batch here", "write imgsz=320 as --img 320"]),
        (["val", "--weights", "best.pt", "--conf-thres=0.1"], ["WEIGHTS is positional", "--conf-thres is --conf"]),
        (["predict", "best.pt", "--source", "a.jpg"], ["SOURCE is positional: give it without --source"]),
        (["bench", "gateway", "--bogus"], []),
    ],
)
def test_unknown_arguments_are_told_by_the_command_with_the_fix(argv, hints, capsys):
    """The official scripts' spellings and Ultralytics' key=value get the command's own usage and what to write."""
    from yolov9.cli import parse

    with pytest.raises(SystemExit) as e:
        parse(argv)
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert e.value.code == 2 and last.startswith(f"yolov9 {' '.join(argv[: 2 if argv[0] == 'bench' else 1])}: error")
    assert "unrecognized arguments" in last and all(h in last for h in hints), err
    assert ("(" in last) is bool(hints)


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
    assert "(default: yolov9-s on a GPU, gelan-t on a CPU)" in out and "(default: 640 on a GPU, 320 on a CPU)" in out
    assert "(default: 16)" in out and "(default: SGD)" in out


def test_cuda_graphs_are_the_default_and_the_cpu_trains_eagerly(subset, tmp_path):
    from yolov9.train.graphed_step import GraphedStep

    trainer = Trainer(_cfg(subset, tmp_path, epochs=1))
    assert trainer.cfg.cuda_graph
    trainer.fit()
    assert not trainer.step.graphs and trainer.step.captures == 0
    with pytest.raises(ValueError, match="--cuda-graph needs one CUDA GPU"):
        GraphedStep(trainer.model, trainer.loss_fn, trainer.state.scaler)


def test_dual_head_model_trains_and_validates(subset, tmp_path):
    """yolov9 models validate on their main head (eval mode gives [auxiliary, main])."""
    summary = Trainer(_cfg(subset, tmp_path, cfg="yolov9-t", img=64, epochs=1, name="dual", val=True)).fit()
    row = _rows(summary["run_dir"])[-1]
    assert 0.0 <= row["map"] <= 1.0 and (Path(summary["run_dir"]) / "val_per_class.txt").exists()


OFFICIAL_HYP = """\
lr0: 0.01
lrf: 0.01
momentum: 0.937
weight_decay: 0.0005
warmup_epochs: 3.0
warmup_momentum: 0.8
warmup_bias_lr: 0.1
box: 7.5
cls: 0.5
cls_pw: 1.0
obj: 0.7
obj_pw: 1.0
dfl: 1.5
iou_t: 0.20
anchor_t: 5.0
fl_gamma: 0.0
hsv_h: 0.015
hsv_s: 0.7
hsv_v: 0.4
degrees: 0.0
translate: 0.1
scale: 0.9
shear: 0.0
perspective: 0.0
flipud: 0.0
fliplr: 0.5
mosaic: 1.0
mixup: 0.15
copy_paste: 0.3
"""


def test_the_official_hyp_file_trains_with_its_gains_and_names_what_it_ignores(subset, tmp_path):
    from yolov9.cli import build_parser
    from yolov9.train.cli import _config

    hyp = tmp_path / "hyp.scratch-high.yaml"
    hyp.write_text(OFFICIAL_HYP.replace("box: 7.5", "box: 5.0"))
    parse = build_parser().parse_args
    cfg = _config(parse(["train", "--data", str(subset), "--hyp", str(hyp)]))
    assert cfg.loss.box == 5.0 and cfg.loss.cls == 0.5 and cfg.loss.dfl == 1.5 and cfg.hyp.mixup == 0.15
    r = subprocess.run(
        [sys.executable, "-m", "yolov9", "train", "--data", str(subset), "--hyp", str(hyp), "--cfg", "gelan-t",
         "--img", "64", "--epochs", "1", "--batch", "4", "--workers", "0", "--device", "cpu", "--no-val",
         "--project", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("note: ignored hyper-parameters") == 1 and "anchor_t" in r.stdout and "copy_paste" in r.stdout
    # the gains reach the loss: the box term scales with box
    from yolov9.core.model import DetectionModel
    from yolov9.train.config import LossGains
    from yolov9.train.loss import DetectionLoss

    model = DetectionModel("gelan-t", nc=3).train()
    feats = model(torch.rand(2, 3, 64, 64))
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.3], [1, 2, 0.4, 0.6, 0.2, 0.4]])
    base = DetectionLoss.for_model(model)(feats, targets)[1]
    doubled = DetectionLoss.for_model(model, LossGains(box=15.0))(feats, targets)[1]
    torch.testing.assert_close(doubled[0], 2 * base[0])
    torch.testing.assert_close(doubled[1:], base[1:])
    hyp.write_text(OFFICIAL_HYP.replace("mixup:", "mix_up:"))
    with pytest.raises(ValueError, match="unknown hyper-parameter 'mix_up'; did you mean 'mixup'"):
        _config(parse(["train", "--hyp", str(hyp)]))


def test_resume_is_exact_when_accumulation_spans_an_epoch_boundary(subset, tmp_path):
    """Nominal batch 24 at batch 4: an optimizer step every 6 micro-batches, 4 micro-batches an epoch, so steps
    fall inside epochs 2 and 3 and the resumed run must know where the last one was."""
    kw = dict(epochs=4, batch=4, nbs=24, hyp={**LIGHT_HYP, "warmup_epochs": 0.0})
    full = Trainer(_cfg(subset, tmp_path, name="acc_full", **kw)).fit()
    part = Trainer(_cfg(subset, tmp_path, name="acc_part", stop_after=2, **kw)).fit()
    ck = torch.load(Path(part["run_dir"]) / "weights" / "last.pt", weights_only=True)
    assert set(ck["train"]["rng"]) <= {"torch", "cuda"}  # training draws from no other generator
    resumed = Trainer(TrainConfig(resume=part["run_dir"], workers=0, device="cpu")).fit()
    a, b = _rows(full["run_dir"]), _rows(resumed["run_dir"])
    for key in ("box", "cls", "dfl"):
        assert b[-1][key] == pytest.approx(a[-1][key], rel=1e-6), key


def test_results_csv_keeps_its_columns_when_validation_skips_epochs(subset, tmp_path):
    import csv

    summary = Trainer(_cfg(subset, tmp_path, epochs=3, val=True, val_interval=2, name="csv", batch=4, nbs=4)).fit()
    with open(Path(summary["run_dir"]) / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["epoch"] for r in rows] == ["1", "2", "3"]
    assert all(None not in r for r in rows)  # no row longer than the header
    assert rows[0]["metrics/mAP50-95"] == "" and rows[1]["metrics/mAP50-95"] != "" and rows[2]["val/box_loss"] != ""
    assert float(rows[1]["metrics/precision"]) >= 0 and float(rows[0]["train/box_loss"]) > 0


def test_resume_without_a_path_takes_the_newest_run_and_says_when_it_is_finished(subset, tmp_path, capsys):
    Trainer(_cfg(subset, tmp_path, epochs=2, name="newest", stop_after=1, workers=0)).fit()
    trainer = Trainer(TrainConfig(resume="latest", project=str(tmp_path)))
    assert trainer.cfg.device == "cpu" and trainer.cfg.workers == 0  # from the run, not given here
    assert trainer.cfg.resume.endswith("newest/weights/last.pt")
    trainer.fit()
    with pytest.raises(ValueError, match="finished all 2 epochs; nothing to resume"):
        Trainer(TrainConfig(resume="latest", project=str(tmp_path)))
    with pytest.raises(FileNotFoundError, match="no run to resume in"):
        Trainer(TrainConfig(resume="latest", project=str(tmp_path / "empty")))


def test_cpu_defaults_finish_and_workers_stay_within_the_cores(subset, tmp_path, capsys):
    trainer = Trainer(TrainConfig(data=str(subset), device="cpu", workers=999, project=str(tmp_path)))
    cfg = trainer.cfg
    assert (cfg.cfg, cfg.img, cfg.epochs) == ("gelan-t", 320, 3) and cfg.workers == os.cpu_count()
    out = capsys.readouterr().out
    assert "on a GPU the defaults are yolov9-s, 640 px, 100 epochs" in out and "capped at the" in out
    from yolov9.core.device import cpu_has_bf16
    from yolov9.train.step import amp_dtype

    assert amp_dtype("auto", torch.device("cpu")) == (torch.bfloat16 if cpu_has_bf16() else None)


@pytest.mark.parametrize(
    "given,message",
    [
        (dict(epochs=0), "--epochs 0: must be at least 1"),
        (dict(batch=0), "--batch 0: must be at least 1 (or -1"),
        (dict(batch=-2), "--batch -2: must be at least 1 (or -1"),
        (dict(img=16), "--img 16: must be at least 32"),
        (dict(nbs=0), "--nbs 0: must be at least 1"),
        (dict(val_interval=0), "--val-interval 0: must be at least 1"),
        (dict(workers=-1), "--workers -1: must be at least 0"),
    ],
)
def test_counts_that_cannot_train_are_one_line_errors(given, message):
    with pytest.raises(BadInput) as e:
        TrainConfig(data="coco128", **given)
    assert str(e.value).startswith(message), str(e.value)


def test_img_is_rounded_up_to_the_models_stride(subset, tmp_path, capsys):
    trainer = Trainer(_cfg(subset, tmp_path, img=72, epochs=1, name="stride"))
    assert trainer.cfg.img == 96
    assert "note: --img 72 is not a multiple of the model's stride 32: training at 96" in capsys.readouterr().out


def test_help_does_not_import_torch():
    code = "import sys; from yolov9.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_trainer_starts_without_torchvision():
    """torchvision (with the torch._dynamo it imports) loads in the trainer's data thread, beside the warm-up: the
    modules a run imports before its first step, model and loss included, do not pull it in."""
    code = (
        "import sys, torch; from yolov9.train.trainer import Trainer; from yolov9.train.loss import DetectionLoss; "
        "from yolov9.core.boxes import xywh2xyxy; box = xywh2xyxy(torch.tensor([[10.0, 20.0, 4.0, 6.0]])); "
        "assert box.tolist() == [[8.0, 17.0, 12.0, 23.0]], box; "
        "print(sorted(m for m in ('torchvision', 'torch._dynamo') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "[]", r.stderr


def test_a_bug_keeps_its_traceback_and_a_mistake_is_one_line(tmp_path):
    bad = tmp_path / "broken.yaml"  # a model config whose layer reads an output that does not exist: a bug path
    bad.write_text("nc: 3\nbackbone:\n  - [-1, 1, Conv, [16, 3, 2]]\nhead:\n  - [[5], 1, Detect, [nc]]\n")
    r = subprocess.run([sys.executable, "-m", "yolov9", "info", str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" in r.stderr
    assert r.stderr.splitlines()[0] == f"yolov9 info: failed running `yolov9 info {bad}`:"
    r = subprocess.run(
        [sys.executable, "-m", "yolov9", "info", str(tmp_path / "none.pt")], capture_output=True, text=True
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_background_compile_still_running_when_the_run_ends_ends_with_it(subset, tmp_path, monkeypatch):
    """--compile loss --compile-background with inductor's own compile (C++ on the CPU, in a second process):
    training starts with the uncompiled loss, each row says whether the compiled one has taken over, and a compile
    still running when the run ends is stopped with it (no process outlives the command)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    trainer = Trainer(_cfg(subset, tmp_path, epochs=3, name="bg", compile="loss", compile_background=True))
    summary = trainer.fit()
    rows = _rows(summary["run_dir"])
    assert [r["loss_compiled"] for r in rows] == sorted(r["loss_compiled"] for r in rows)  # once on, it stays on
    assert rows[0]["loss_compiled"] is False  # the first epoch did not wait for the compile
    assert all(isinstance(r["loss_cache_filled"], bool) for r in rows)  # inductor's cache filled by a second process
    loss = trainer.step.loss_fn
    assert loss.fill is not None and not loss.fill.running()
    assert loss.wait(timeout=60) and (loss.take_over() or "stopped" in loss.failure), loss.failure


def test_a_run_this_machine_compiled_before_compiles_in_the_background_without_a_second_process(
    subset, tmp_path, monkeypatch
):
    """The record a compiled run leaves (`note_compiled`) says inductor's cache holds every graph: a later run of
    the same model and batch compiles its parts in the background straight from the cache, with no second process
    to fill it first; without the record the second process fills it."""
    from yolov9.train.compiled import note_compiled

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    fresh = Trainer(_cfg(subset, tmp_path, epochs=1, name="fresh", compile="loss", compile_background=True))
    fresh._setup()
    assert not fresh.step.opts.compile_cached and fresh.step.loss_fn.fill_first
    note_compiled(fresh.compile_sig)
    again = Trainer(_cfg(subset, tmp_path, epochs=1, name="again", compile="loss", compile_background=True))
    again._setup()
    assert again.step.opts.compile_cached and again.step.loss_fn.background and not again.step.loss_fn.fill_first


def test_the_compiled_record_waits_for_every_part_compiled_in_the_background(subset, tmp_path, monkeypatch):
    """The record says the cache holds every part: with the forward taken over and the loss still compiling (or
    failed) there is none yet, so a later run does not skip the second process for a loss missing from the cache."""
    from yolov9.train.compiled import compiled_before

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    trainer = Trainer(_cfg(subset, tmp_path, epochs=1, name="rec", compile="layers", compile_background=True))
    trainer._setup()
    forward, loss = trainer.step.background
    forward.version = 1  # as at the forward's takeover
    trainer._note_compiled({})
    assert not compiled_before(trainer.compile_sig)
    loss.version = 1
    trainer._note_compiled({})
    assert compiled_before(trainer.compile_sig)


def test_training_allocates_in_expandable_segments_unless_the_user_chose(monkeypatch):
    from yolov9.train.cli import _expandable_segments

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    _expandable_segments()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    _expandable_segments()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_expandable_segments_take_effect_when_set_after_torch_is_imported():
    """The command sets the variable after torch is imported (building the parser imports it), before any CUDA use."""
    code = (
        "import torch\n"
        "from yolov9.train.cli import _expandable_segments\n"
        "_expandable_segments()\n"
        "x = torch.empty(1 << 20, device='cuda')\n"
        "snap = torch.cuda.memory_snapshot()\n"
        "segments = snap['segments'] if isinstance(snap, dict) else snap\n"
        "print(all(s.get('is_expandable') for s in segments) and len(segments) > 0)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_compiles_the_layers_of_a_run_this_machine_compiled_before(subset, tmp_path, monkeypatch, capsys):
    """A run with --compile layers leaves a record beside inductor's cache; a later run of the same model and batch
    with the default --compile auto then compiles its layers from the cache (the threshold lowered to 1 image, so
    that a short run counts as long enough)."""
    from yolov9.train import compiled

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(compiled, "AUTO_LAYERS_WARM", 1)
    first = Trainer(
        _cfg(subset, tmp_path, epochs=1, name="first", compile="layers", compile_background=False, device="0")
    )
    first.fit()
    assert compiled.compiled_before(first.compile_sig)
    capsys.readouterr()
    again = Trainer(_cfg(subset, tmp_path, epochs=1, name="again", compile_background=False, device="0"))
    summary = again.fit()
    assert again.step.opts.compile == "layers"
    assert "compiled (layers and loss) from this machine's cache" in capsys.readouterr().out
    assert _rows(summary["run_dir"])[0]["compile_cache_misses"] == 0
    other = Trainer(_cfg(subset, tmp_path, epochs=1, name="other", batch=4, device="0"))  # not compiled at batch 4
    other.fit()
    assert other.step.opts.compile == "off"


def test_a_stalled_step_prints_every_threads_stack_and_a_finished_epoch_stops_watching(
    subset, tmp_path, monkeypatch, capfd
):
    """A step that stalls past stall.STALL_S prints where each thread is; after the epoch the report is disarmed, so
    nothing more is printed once the run has ended. The step stalls asleep: faulthandler walks the threads' stacks
    without the interpreter lock, which is safe for a thread that waits (as a stalled run's do) and can crash on one
    that is running Python, as every step would be under a limit shorter than a step."""
    import time

    import yolov9.train.engine as engine
    import yolov9.train.stall as stall

    limit, calls, micro = 2.0, [], engine.TrainStep.micro

    def stalls_once(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            time.sleep(1.5 * limit)
        return micro(self, *args, **kwargs)

    monkeypatch.setattr(stall, "STALL_S", limit)
    monkeypatch.setattr(engine.TrainStep, "micro", stalls_once)
    Trainer(_cfg(subset, tmp_path, epochs=1, batch=4, nbs=4, name="stall")).fit()
    err = capfd.readouterr().err
    assert "Timeout (0:00:02)!" in err and "in stalls_once" in err and "in train_one_epoch" in err, err[-2000:]
    time.sleep(1.2 * limit)
    assert "Timeout" not in capfd.readouterr().err
