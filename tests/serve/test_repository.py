"""The model repository: python-backend model and the tensorrt_plan ensemble variant for NGC Triton."""

from __future__ import annotations

import re

import pytest

from serve.repository import build_repo


def test_repository_layout_and_trt_variant(checkpoint, tmp_path):
    d = build_repo(
        checkpoint,
        tmp_path,
        "det",
        max_batch=32,
        queue_delay_us=800,
        kind="gpu",
        instances=2,
        max_det=50,
        img_size=640,
        trt_variant=True,
    )
    cfg = (d / "config.pbtxt").read_text()
    assert 'backend: "python"' in cfg and "max_batch_size: 32" in cfg and "KIND_GPU" in cfg and "count: 2" in cfg
    assert "max_queue_delay_microseconds: 800" in cfg and "preferred_batch_size: [ 4, 8, 16, 32 ]" in cfg
    assert "dims: [ 50, 6 ]" in cfg and "model_warmup" in cfg and (d / "1" / "model.py").exists()
    assert (d / "1" / checkpoint.name).exists()
    names = re.search(r'key: "names" value: \{ string_value: "(.*)" \}', cfg).group(1)
    assert "person" in names
    plan = (tmp_path / "det_plan" / "config.pbtxt").read_text()
    assert 'platform: "tensorrt_plan"' in plan and "TYPE_FP16" in plan
    ens = (tmp_path / "det_trt" / "config.pbtxt").read_text()
    assert 'platform: "ensemble"' in ens
    for step in ("det_pre", "det_plan", "det_post"):
        assert f'model_name: "{step}"' in ens
        assert (tmp_path / step / "config.pbtxt").exists()
    assert (tmp_path / "det_pre" / "1" / "model.py").exists() and (tmp_path / "det_post" / "1" / "model.py").exists()


def test_queue_delay_bounds(checkpoint, tmp_path):
    with pytest.raises(ValueError, match="0.1-2 ms"):
        build_repo(checkpoint, tmp_path, queue_delay_us=5000)
