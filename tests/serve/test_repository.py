"""The model repository: python-backend model and the tensorrt_plan ensemble variant for NGC Triton."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from tritonclient.grpc import model_config_pb2 as mc

from yolov9.serve.config import RepoConfig
from yolov9.serve.repository import build_repo, read_config, write_config


def test_repository_layout_and_trt_variant(checkpoint, tmp_path):
    cfg = RepoConfig("det", max_batch=32, queue_delay_us=800, kind="gpu", instances=2, max_det=50, img=640)
    d = build_repo(checkpoint, tmp_path, replace(cfg, trt_variant=True))
    cfg = read_config(d)
    assert cfg.backend == "python" and cfg.max_batch_size == 32
    assert [(g.kind, g.count) for g in cfg.instance_group] == [(mc.ModelInstanceGroup.KIND_GPU, 2)]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 800
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8, 16, 32]
    assert list(next(o for o in cfg.output if o.name == "DETECTIONS").dims) == [50, 6]
    assert cfg.model_warmup and (d / "1" / "model.py").exists()
    assert (d / "1" / checkpoint.name).exists()
    assert json.loads(cfg.parameters["names"].string_value)[0] == "person"
    assert cfg.parameters["gpu_wait"].string_value == "spin"  # CUDA's own wait unless asked
    block = read_config(build_repo(checkpoint, tmp_path / "block", RepoConfig("det", gpu_wait="block")))
    assert block.parameters["gpu_wait"].string_value == "block"
    plan = (tmp_path / "det_plan" / "config.pbtxt").read_text()
    assert 'platform: "tensorrt_plan"' in plan and "TYPE_FP16" in plan
    ens = (tmp_path / "det_trt" / "config.pbtxt").read_text()
    assert 'platform: "ensemble"' in ens
    for step in ("det_pre", "det_plan", "det_post"):
        assert f'model_name: "{step}"' in ens
        assert (tmp_path / step / "config.pbtxt").exists()
    assert (tmp_path / "det_pre" / "1" / "model.py").exists() and (tmp_path / "det_post" / "1" / "model.py").exists()


def test_queue_delay_bounds(checkpoint, tmp_path):
    for bad in (5000, -1):
        with pytest.raises(ValueError, match="0-2000"):
            build_repo(checkpoint, tmp_path, RepoConfig(queue_delay_us=bad))
    # 0: no wait for company (Triton's default when the field is absent)
    none = read_config(build_repo(checkpoint, tmp_path, RepoConfig(queue_delay_us=0)))
    assert none.HasField("dynamic_batching") and none.dynamic_batching.max_queue_delay_microseconds == 0


def test_preferred_batch_sizes(checkpoint, tmp_path):
    """The default caps batches at 32 with preferred sizes up to it; 'none' drops the line (Triton then sends
    whatever is queued); a list is written as given; sizes above the max batch are refused before anything in the
    repository is touched."""
    default = read_config(build_repo(checkpoint, tmp_path))
    assert default.max_batch_size == 32 and list(default.dynamic_batching.preferred_batch_size) == [4, 8, 16, 32]
    assert [g.count for g in default.instance_group] == [2]  # one batching instance can stall a request 0.5 s
    none = read_config(build_repo(checkpoint, tmp_path, RepoConfig(max_batch=16, preferred_batch=[])))
    assert not none.dynamic_batching.preferred_batch_size and none.HasField("dynamic_batching")
    assert none.dynamic_batching.max_queue_delay_microseconds == RepoConfig().queue_delay_us
    cfg = (
        build_repo(checkpoint, tmp_path, RepoConfig(max_batch=16, preferred_batch=[8, 16])) / "config.pbtxt"
    ).read_text()
    assert list(read_config(tmp_path / "yolov9").dynamic_batching.preferred_batch_size) == [8, 16]
    with pytest.raises(ValueError, match="1..16"):
        build_repo(checkpoint, tmp_path, RepoConfig(max_batch=16, preferred_batch=[8, 32]))
    assert (tmp_path / "yolov9" / "config.pbtxt").read_text() == cfg


def test_trt_variant_pre_and_post_stages_run_in_real_triton(trained_tiny, tmp_path, coco48):
    """The NGC ensemble's python stages, served for real (the tensorrt_plan stage needs TensorRT, absent here):
    pre -> local engine on its fp16 output -> post must give the python-backend model's detections."""
    import numpy as np
    import torch
    import tritonclient.grpc as grpcclient
    from torchvision.ops import box_iou

    from tests.serve.conftest import free_port
    from yolov9.core.checkpoint import load_model
    from yolov9.export.torch_engine import TorchEngine
    from yolov9.serve.detector import Detector, Request
    from yolov9.serve.triton_server import TritonServer

    build_repo(trained_tiny, tmp_path / "repo", RepoConfig("det", max_batch=8, kind="cpu", img=160, trt_variant=True))
    post = read_config(tmp_path / "repo" / "det_post")
    post.parameters["conf"].string_value = "0.05"  # thresholds live in the config
    write_config(tmp_path / "repo" / "det_post", post)
    only_python = ["--model-control-mode=explicit", "--load-model=det_pre", "--load-model=det_post"]
    ports = (free_port(), free_port(), free_port())
    srv = TritonServer(tmp_path / "repo", ports, extra_args=only_python, log_file=tmp_path / "triton.log")
    with srv.start(timeout=180, model="det_post"):
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        engine = TorchEngine(load_model(trained_tiny), "cpu", img_size=160)
        local = Detector(str(trained_tiny), device="cpu", img_size=160)
        checked = 0
        for img in sorted((coco48 / "images").glob("*.jpg"))[:4]:
            data = np.frombuffer(img.read_bytes(), dtype=np.uint8)[None]
            inp = grpcclient.InferInput("IMAGE", list(data.shape), "UINT8")
            inp.set_data_from_numpy(data)
            pre = client.infer("det_pre", [inp])
            images, meta = pre.as_numpy("images"), pre.as_numpy("META")
            assert images.shape == (1, 3, 160, 160) and images.dtype == np.float16 and meta.shape == (1, 5)
            raw = engine(torch.from_numpy(images.astype(np.float32))).half().numpy()
            ins = [
                grpcclient.InferInput("output0", list(raw.shape), "FP16"),
                grpcclient.InferInput("META", list(meta.shape), "FP32"),
            ]
            ins[0].set_data_from_numpy(raw)
            ins[1].set_data_from_numpy(meta)
            post = client.infer("det_post", ins)
            n = int(post.as_numpy("NUM_DETS")[0, 0])
            got = post.as_numpy("DETECTIONS")[0, :n]
            ((want, m),) = local([Request(img.read_bytes(), conf=0.05, iou=0.45, max_det=100)])
            want = want[:m].numpy()
            # fp16 images and outputs move scores slightly: compare detections clear of the 0.05 threshold. Where
            # the tiny overfit model puts several boxes of one object at scores that round to 1.0 in fp16, NMS may
            # keep another of them: each detection must share its corners (2 px) with one of its class in the other
            # set or overlap it (IoU > 0.45, the NMS threshold)
            for a, b in ((got, want), (want, got)):
                for det in a[a[:, 4] > 0.06]:
                    iou = box_iou(torch.from_numpy(det[None, :4]), torch.from_numpy(b[:, :4]))[0].numpy()
                    near = (np.abs(b[:, :4] - det[:4]).max(1) < 2.0) | (iou > 0.45)
                    assert ((b[:, 5] == det[5]) & near).any(), (det, b)
            assert abs(n - m) <= max(1, m // 10)
            checked += int((want[:, 4] > 0.06).sum())
        assert checked > 0


def test_version_folders_beyond_the_history_go_and_numbers_are_not_reused(checkpoint, tmp_path):
    """What deploy and rollback leave on disk (Triton's part is tested in test_operations): versions out of the
    history lose their folders, the built model keeps its own, and the next version counts past every one written."""
    from yolov9.serve.deploy import _prune, _write_state, add_version, versions_in

    build_repo(checkpoint, tmp_path, RepoConfig(img=160))
    assert [add_version(checkpoint, tmp_path, "yolov9") for _ in range(3)] == [2, 3, 4]
    _prune(tmp_path, "yolov9", [3, 4])  # deploy with keep=2
    assert versions_in(tmp_path, "yolov9") == [1, 3, 4]
    _write_state(tmp_path, "yolov9", {"serving": 3, "history": [3], "latest": 4})
    _prune(tmp_path, "yolov9", [3])  # rolled back from 4
    assert versions_in(tmp_path, "yolov9") == [1, 3]
    assert add_version(checkpoint, tmp_path, "yolov9") == 5


def test_instances_share_the_threads(checkpoint, tmp_path):
    """Each instance takes its share of torch's threads, read from the config Triton hands it (as JSON); a GPU
    group counts once per visible GPU."""
    from google.protobuf import json_format

    from yolov9.serve.detector import threads_per_instance

    for n in (1, 2, 3):
        cfg = read_config(build_repo(checkpoint, tmp_path / str(n), RepoConfig(kind="cpu", instances=n)))
        as_triton_gives = json.loads(json_format.MessageToJson(cfg, preserving_proto_field_name=True))
        assert threads_per_instance(as_triton_gives) == max(1, torch.get_num_threads() // n)
    gpu = read_config(build_repo(checkpoint, tmp_path / "gpu", RepoConfig(kind="gpu", instances=2)))
    as_triton_gives = json.loads(json_format.MessageToJson(gpu, preserving_proto_field_name=True))
    assert as_triton_gives["instance_group"][0]["count"] == 2
    gpus = max(torch.cuda.device_count(), 1)
    assert threads_per_instance(as_triton_gives) == max(1, torch.get_num_threads() // (2 * gpus))
    as_triton_gives["instance_group"][0]["gpus"] = [0, 1, 2]  # two instances on each of three GPUs
    assert threads_per_instance(as_triton_gives) == max(1, torch.get_num_threads() // 6)
