import io
import os

import pytest
import torch

from yolov9.serve.detector import Detector, Request, graph_buckets


def test_graph_buckets_cover_every_batch_size():
    assert graph_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert graph_buckets(20) == [1, 2, 4, 8, 16, 20]
    for max_batch in (1, 5, 64):
        buckets = graph_buckets(max_batch)
        assert all(any(b >= n for b in buckets) for n in range(1, max_batch + 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_cuda_graph_buckets_match_eager(trained_tiny, coco48):
    """Padding a batch up to its bucket and replaying the captured graph gives the eager detections."""
    blobs = [p.read_bytes() for p in sorted((coco48 / "images").glob("*.jpg"))[:5]]
    reqs = [Request(b, conf=0.05) for b in blobs]
    graphed = Detector(str(trained_tiny), device="cuda", img_size=160, max_batch=8)
    graphed.warmup()
    eager = Detector(str(trained_tiny), device="cuda", img_size=160, cuda_graphs=False)
    assert graphed.buckets == [1, 2, 4, 8]  # max_batch 8
    for (a, n), (b, m) in zip(graphed(reqs), eager(reqs)):
        assert n == m
        # fp16 engine, batches of 5 and 8 run by different cuDNN kernels: boxes agree to a few fp16 steps of the
        # 160 px input (0.06-0.125 px there), scaled back x4 to the 640 px photos
        torch.testing.assert_close(a[:n], b[:m], rtol=1e-3, atol=1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's waits need a CUDA GPU")
def test_a_sleeping_wait_for_the_gpu_gives_the_spinning_waits_detections(trained_tiny, coco48):
    """gpu_wait='block' copies the results into pinned memory and sleeps on a blocking event: the same
    detections as the plain copy, and the host tensor is whole when it returns (no copy still in flight)."""
    from yolov9.core.device import to_host

    x = torch.randn(4096, 7, device="cuda") * 100
    host = to_host(x, "block")
    assert host.device.type == "cpu" and host.is_pinned()
    torch.testing.assert_close(host, x.cpu(), rtol=0, atol=0)
    assert to_host(x, "spin").is_pinned() is False  # the plain copy
    blobs = [p.read_bytes() for p in sorted((coco48 / "images").glob("*.jpg"))[:6]]
    reqs = [Request(b, conf=0.05) for b in blobs]
    got = {}
    for wait in ("block", "spin"):
        det = Detector(str(trained_tiny), device="cuda", img_size=160, max_batch=8)
        det.gpu_wait = wait
        det.warmup()
        timings: dict[str, float] = {}
        got[wait] = det(reqs, timings=timings)
        assert set(timings) == {"decode", "letterbox", "engine", "nms"} and min(timings.values()) >= 0
    assert sum(n for _, n in got["block"]) > 0
    for (a, n), (b, m) in zip(got["block"], got["spin"]):
        assert n == m
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_batch_with_mixed_parameters_matches_each_request_alone(trained_tiny, coco48):
    """One dynamic batch mixes requests with their own conf, IoU, max_det and classes (two IoU groups here):
    each gets exactly what it gets when sent alone, including a bad image in the middle."""
    blobs = [p.read_bytes() for p in sorted((coco48 / "images").glob("*.jpg"))[:5]]
    reqs = [
        Request(blobs[0], conf=0.05),
        Request(blobs[1], conf=0.05, iou=0.7, max_det=2),
        Request(b"not an image"),
        Request(blobs[2], conf=0.2, classes=[0]),
        Request(blobs[3], conf=0.05, iou=0.7),
        Request(blobs[4], conf=0.05, max_det=1),
    ]
    det = Detector(str(trained_tiny), device="cpu", img_size=160, max_det=50)
    batched = det(reqs)
    assert isinstance(batched[2], Exception)
    assert sum(res[1] for k, res in enumerate(batched) if k != 2) > 3  # detections to compare, not all empty
    for k, r in enumerate(reqs):
        if k == 2:
            continue
        ((want, m),) = det([r])
        got, n = batched[k]
        assert n == m and n <= min(r.max_det, 50)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)  # padding rows stay zero too


def test_bad_parameters_fail_only_their_request(trained_tiny, coco48):
    """Parameters out of range (a Triton-direct client has no gateway to check them) give that request a one-line
    error; a NaN IoU used to fail the whole batch it was put in."""
    good = sorted((coco48 / "images").glob("*.jpg"))[0].read_bytes()
    det = Detector(str(trained_tiny), device="cpu", img_size=160, max_det=50)
    bad = [dict(iou=float("nan")), dict(conf=2.0), dict(conf=float("nan")), dict(max_det=0), dict(classes=[-1])]
    out = det([Request(good, conf=0.05)] + [Request(good, **kw) for kw in bad] + [Request(good, conf=0.05)])
    errors = [str(r) for r in out[1:-1]]
    assert errors == [
        "iou nan is not in (0, 1]",
        "conf 2.0 is not in [0, 1]",
        "conf nan is not in [0, 1]",
        "max_det 0 is not in [1, 1000]",
        "class id -1 is negative",
    ]
    ((alone, n),) = det([Request(good, conf=0.05)])
    assert n > 0 and out[0][1] == out[-1][1] == n
    torch.testing.assert_close(out[0][0], alone, rtol=1e-4, atol=1e-3)


def test_a_sliver_of_an_image_is_served_with_its_batch(trained_tiny, coco48):
    """A 4000 x 1 photo letterboxes to one row (not zero, which the resize refuses): it gets an answer and the
    requests batched with it get theirs."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4000, 1), (200, 30, 30)).save(buf, "JPEG")
    good = sorted((coco48 / "images").glob("*.jpg"))[0].read_bytes()
    det = Detector(str(trained_tiny), device="cpu", img_size=160, max_det=50)
    out = det([Request(good, conf=0.05), Request(buf.getvalue()), Request(good, conf=0.05)])
    assert not any(isinstance(r, Exception) for r in out)
    ((alone, n),) = det([Request(good, conf=0.05)])
    assert out[0][1] == out[2][1] == n and out[1][1] >= 0
    torch.testing.assert_close(out[0][0], alone, rtol=1e-4, atol=1e-3)


def test_bench_detector_reports_each_batch(trained_tiny, coco48, tmp_path):
    import json

    from yolov9.cli import main

    out = tmp_path / "det.json"
    images = coco48 / "images"
    args = ["bench", "detector", str(trained_tiny), "--images", str(images), "--img", "160", "--device", "cpu"]
    assert main([*args, "--batches", "1,3", "--iters", "2", "--warmup", "1", "--conf", "0.05", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["batch"] for r in rows] == [1, 3] and all(r["images_per_s"] > 0 for r in rows)
    assert all(r["cpu_ms_per_image"] > 0 and r["gpu_wait"] == "spin" for r in rows)
    assert set(rows[0]["stage_share"]) == {"decode", "letterbox", "engine", "nms"}
    for r in rows:  # every detection was a candidate over the threshold before NMS
        assert 0 < r["detections_per_image"] <= r["candidates_per_image"]


def test_bench_detector_in_several_processes(trained_tiny, coco48, tmp_path):
    import json

    from yolov9.cli import main

    out = tmp_path / "procs.json"
    images = coco48 / "images"
    args = ["bench", "detector", str(trained_tiny), "--images", str(images), "--img", "160", "--device", "cpu"]
    assert main([*args, "--procs", "2", "--batches", "2", "--iters", "2", "--warmup", "1", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["procs"] == 2 and row["batch"] == 2 and row["images_per_s"] > 0 and row["mps"] is False
    # torch's threads may keep several cores busy per process, but not more than the machine has
    assert row["cpu_ms_per_image"] > 0 and 0 < row["cores_busy"] <= 1.1 * os.cpu_count()
    # a process that cannot start (no such engine) is reported, not waited for
    bad = ["bench", "detector", str(tmp_path / "missing.pt"), "--images", str(images), "--device", "cpu"]
    assert main([*bad, "--procs", "2", "--batches", "2", "--iters", "1"]) == 2


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="the captured step needs a CUDA GPU")
        ),
    ],
)
def test_more_candidates_than_the_step_keeps_fall_back_to_all_predictions(trained_tiny, coco48, device):
    """A batch with more anchors over its thresholds than the step's buffer holds gets the same detections
    (NMS of the raw predictions instead), on the CPU and through the captured graphs alike."""
    blobs = [p.read_bytes() for p in sorted((coco48 / "images").glob("*.jpg"))[:3]]
    reqs = [
        Request(blobs[0], conf=0.01),
        Request(blobs[1], conf=0.05, iou=0.6),
        Request(blobs[2], conf=0.01, max_det=3),
    ]
    det = Detector(str(trained_tiny), device=device, img_size=160, max_det=50, max_batch=4)
    det.warmup()
    roomy = det(reqs)
    assert det.predict(reqs).candidates[-1, 0] > 3  # one per image would not hold them
    det.step.per_image = 1
    det.run = (
        type(det.run)(det.step, clone=False) if det.buckets else det.step
    )  # captured again with the smaller buffer
    tight = det(reqs)
    assert sum(n for _, n in roomy) > 3
    for (a, n), (b, m) in zip(roomy, tight):
        assert n == m
        torch.testing.assert_close(a, b)
