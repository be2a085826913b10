"""The real Triton server behind the real gateway: results, bad input, concurrency, outage and recovery."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import struct
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.serve.conftest import CONF, IMG, STAND_IN, free_port
from yolov9.core.coco_names import COCO_NAMES
from yolov9.serve.detector import Detector, Request
from yolov9.serve.gateway.backend import SLOW_CHECKS_BEFORE_DOWN, TritonPool
from yolov9.serve.gateway.process import GatewayProcess
from yolov9.serve.gateway.settings import Settings


def _coco_images(coco48, n: int) -> list[bytes]:
    return [p.read_bytes() for p in sorted((coco48 / "images").glob("*.jpg"))[:n]]


def _post(
    gw,
    data: bytes,
    ctype: str = "image/jpeg",
    params: str = f"conf={CONF}",
    path: str = "/v1/detect",
    headers: dict | None = None,
):
    return httpx.post(
        f"{gw.url}{path}?{params}", content=data, headers={"Content-Type": ctype, **(headers or {})}, timeout=60
    )


def test_http_detections_equal_local_inference(gateway, checkpoint, coco48):
    local = Detector(str(checkpoint), device="cpu", img_size=IMG)
    for data in _coco_images(coco48, 4):
        r = _post(gateway, data)
        assert r.status_code == 200, r.text
        body = r.json()
        ((dets, n),) = local([Request(data, conf=CONF, iou=0.45, max_det=100)])
        got = np.array([d["box"] + [d["score"], d["class_id"]] for d in body["detections"]]).reshape(-1, 6)
        assert len(got) == n > 0
        np.testing.assert_allclose(got[:, :4], dets[:n, :4].numpy(), atol=0.02)
        np.testing.assert_array_equal(got[:, 5], dets[:n, 5].numpy())
        w, h = Image.open(io.BytesIO(data)).size
        assert (body["width"], body["height"]) == (w, h)
        assert all(
            0 <= d["box"][0] <= d["box"][2] <= w and 0 <= d["box"][1] <= d["box"][3] <= h for d in body["detections"]
        )
        assert all(d["class_name"] == COCO_NAMES[d["class_id"]] for d in body["detections"])


def test_common_client_mistakes_get_a_json_4xx_that_says_what_to_send(gateway, coco48):
    """curl's default form content type for --data-binary, a multipart field with another name, text where the
    file belongs, an empty batch field: each a JSON error naming the fix, never a plain-text 500."""
    img = _coco_images(coco48, 1)[0]
    url = f"{gateway.url}/v1/detect?conf={CONF}"
    cases = [
        (httpx.post(url, content=img, headers={"Content-Type": "application/x-www-form-urlencoded"}), 415,
         "Content-Type: image/jpeg"),
        (httpx.post(url, files={"image": ("a.jpg", img, "image/jpeg")}), 400, "fields 'image' but no 'file'"),
        (httpx.post(url, data={"file": "img.jpg"}, files={"other": ("x.txt", b"x", "text/plain")}), 400,
         "'file' holds text, not a file"),
        (httpx.post(f"{gateway.url}/v1/detect/batch", data={"files": ""}, files={"x": ("x", b"", "text/plain")}), 400,
         "'files' holds text"),
        (httpx.post(f"{gateway.url}/v1/detect/batch", files={"file": ("a.jpg", img, "image/jpeg")}), 400,
         "no 'files': send -F files=@image.jpg"),
        (httpx.post(f"{gateway.url}/v1/detect/batch", content=img, headers={"Content-Type": "image/jpeg"}), 415,
         "multipart"),
    ]  # fmt: skip
    for r, status, hint in cases:
        assert r.status_code == status, (r.status_code, r.text)
        assert r.headers["content-type"] == "application/json" and hint in r.json()["detail"], r.text
    spec = httpx.get(f"{gateway.url}/openapi.json").json()["paths"]
    assert "multipart/form-data" in spec["/v1/detect"]["post"]["requestBody"]["content"]
    assert "image/jpeg" in spec["/v1/detect"]["post"]["requestBody"]["content"]
    for path in ("/v1/detect", "/v1/detect/batch", "/v1/detect/annotated"):  # the query parameters, documented
        params = {p["name"]: p for p in spec[path]["post"]["parameters"]}
        assert set(params) == {"conf", "iou", "max_det", "classes"} and params["conf"]["in"] == "query"
        assert params["max_det"]["schema"]["maximum"] == 1000 and params["conf"]["description"]


def test_multipart_batch_annotated_models_and_docs(gateway, coco48):
    imgs = _coco_images(coco48, 3)
    r = httpx.post(f"{gateway.url}/v1/detect?conf={CONF}", files={"file": ("a.jpg", imgs[0], "image/jpeg")})
    assert r.status_code == 200 and r.json()["detections"]
    r = httpx.post(
        f"{gateway.url}/v1/detect/batch?conf={CONF}&max_det=5",
        files=[("files", (f"{i}.jpg", b, "image/jpeg")) for i, b in enumerate(imgs)],
        timeout=60,
    )
    assert r.status_code == 200
    assert [len(x["detections"]) for x in r.json()["results"]] == [5, 5, 5]
    # a file at fault is answered in its place and the others keep their results; a fault of the request fails it
    files = [
        ("files", ("a.jpg", imgs[0], "image/jpeg")),
        ("files", ("bad.jpg", b"not a jpeg" * 9, "image/jpeg")),
        ("files", ("big.jpg", imgs[1] + bytes(2 * 2**20), "image/jpeg")),  # over the tests' 2 MiB upload limit
        ("files", ("notes.txt", b"hello", "text/plain")),
        ("files", ("c.jpg", imgs[2], "image/jpeg")),
    ]
    r = httpx.post(f"{gateway.url}/v1/detect/batch?conf={CONF}", files=files, timeout=60)
    assert r.status_code == 200, r.text
    ok, bad, big, text, ok2 = r.json()["results"]
    assert ok["detections"] and ok2["detections"] and ok["width"] == Image.open(io.BytesIO(imgs[0])).width
    assert (bad["status"], bad["error"]) == (400, "bad_image") and bad["detail"].startswith(
        "files[1] (bad.jpg): not a decodable image"
    ), bad
    assert (big["status"], big["error"]) == (413, "too_large") and big["detail"].startswith("files[2] (big.jpg): over")
    assert (text["status"], text["error"]) == (415, "unsupported_type") and "files[3] (notes.txt)" in text["detail"]
    r = httpx.post(f"{gateway.url}/v1/detect/batch?classes=999", files=files[:2], timeout=60)
    assert r.status_code == 422 and r.json()["detail"].startswith("classes: [999] not among"), r.text
    r = _post(gateway, imgs[1], path="/v1/detect/annotated")
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(r.content)).size == Image.open(io.BytesIO(imgs[1])).size
    r = httpx.get(f"{gateway.url}/v1/models")
    assert r.status_code == 200 and r.json()["models"][0]["classes"][0] == "person"
    # the decoder the model instance picked (core/decode.py), from the metric it publishes on Triton
    assert [e["decoders"] for e in r.json()["models"][0]["endpoints"]] == [{"cpu": 2}]  # two instances by default
    assert httpx.get(f"{gateway.url}/openapi.json").json()["paths"]["/v1/detect"]
    assert httpx.get(f"{gateway.url}/docs").status_code == 200
    every = _post(gateway, imgs[0]).json()["detections"]
    keep = sorted({d["class_id"] for d in every})[:2]
    only = _post(gateway, imgs[0], params=f"conf={CONF}&classes={','.join(map(str, keep))}").json()["detections"]
    assert only and {d["class_id"] for d in only} <= set(keep)
    assert len(only) == sum(d["class_id"] in keep for d in every)


def test_triton_instances_see_the_callers_pythonpath(triton):
    # conftest asks for nvImageCodec and puts a stand-in for it, whose import fails, on PYTHONPATH alone; a real
    # nvImageCodec installed in site-packages is found first and says why it cannot decode on the CPU instead
    log = Path(triton.log_file).read_text()
    reasons = re.findall(r"decoder nvimgcodec unavailable on cpu: (.*); trying nvjpeg", log)
    assert reasons and set(reasons) <= {f"its import failed: {STAND_IN}", "decodes on a CUDA device, not cpu"}


def _png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(
    "case,status",
    [
        ("garbage", 400),
        ("truncated", 400),
        ("empty", 400),
        ("too_large", 413),
        ("bomb", 413),
        ("jpeg_bomb", 413),
        ("wrong_type", 415),
        ("bad_conf", 422),
        ("bad_classes", 422),
        ("bad_max_det", 422),
        ("unknown_class", 422),
    ],
)
def test_bad_input_gets_clear_error_and_server_stays_healthy(gateway, coco48, case, status):
    good = _coco_images(coco48, 1)[0]
    data, ctype, params = good, "image/jpeg", f"conf={CONF}"
    if case == "garbage":
        data = b"this is not an image at all" * 10
    elif case == "truncated":
        data = good[: len(good) // 3]
    elif case == "empty":
        data = b""
    elif case == "too_large":
        data = good + b"\x00" * (3 * 2**20)
    elif case == "bomb":
        data, ctype = _png_header(100_000, 100_000), "image/png"
    elif case == "jpeg_bomb":  # a real JPEG whose frame header declares 20,000 x 20,000
        sof = good.index(b"\xff\xc0")
        data = good[: sof + 5] + (20_000).to_bytes(2, "big") * 2 + good[sof + 9 :]
    elif case == "wrong_type":
        ctype = "text/plain"
    elif case == "bad_conf":
        params = "conf=2"
    elif case == "bad_classes":
        params = "classes=cat"
    elif case == "bad_max_det":
        params = "max_det=0"
    elif case == "unknown_class":
        params = "classes=0,80"  # the model has 80 classes: 0-79
    r = _post(gateway, data, ctype, params)
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "detail"} and isinstance(body["detail"], str) and body["detail"]
    if status == 422:
        assert body["error"] == "invalid_parameters" and ("80" in body["detail"]) == (case == "unknown_class")
        assert body["detail"].startswith(case.removeprefix("bad_") + ": ") or case == "unknown_class", body
    assert _post(gateway, good).status_code == 200
    # ready again within a few health checks (a worker's check can lag behind on a busy 2-core machine)
    deadline = time.monotonic() + 10
    while (ready := httpx.get(f"{gateway.url}/readyz")).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ready.status_code == 200, ready.text


def test_triton_direct_bad_parameters_fail_only_their_request(triton, coco48):
    """A Triton-direct client (no gateway to validate) sends a NaN IoU in a batch with good requests: it alone gets
    an error that names the parameter (422 when a gateway relays it); the others are answered."""
    import grpc

    from yolov9.serve.gateway.backend import classify, infer_stub, read_detections, triton_request

    good = _coco_images(coco48, 1)[0]

    async def send_all():
        stub = infer_stub(triton.grpc_url)
        requests = [triton_request(good, CONF) for _ in range(3)]
        requests[1] = triton_request(good, CONF, iou=float("nan"))
        for r in requests:
            r.model_name = "yolov9"
        try:
            return await asyncio.gather(*(stub.ModelInfer(r, timeout=60) for r in requests), return_exceptions=True)
        finally:
            await stub.channel.close()

    answers = asyncio.run(send_all())
    assert isinstance(answers[1], grpc.aio.AioRpcError), answers[1]
    err = classify(answers[1])
    assert err.kind == "invalid_parameters" and str(err) == "iou nan is not in (0, 1]", str(err)
    got = [read_detections(a) for a in (answers[0], answers[2])]
    assert len(got[0]) > 0 and np.array_equal(got[0], got[1])


def test_default_parameters_detect_like_local_inference(gateway, checkpoint, coco48):
    """With no query the gateway leaves the parameters out of the Triton request: the model's defaults apply."""
    local = Detector(str(checkpoint), device="cpu", img_size=IMG)
    for data in _coco_images(coco48, 2):
        r = _post(gateway, data, params="")
        assert r.status_code == 200, r.text
        ((dets, n),) = local([Request(data)])
        got = np.array([d["box"] + [d["score"], d["class_id"]] for d in r.json()["detections"]]).reshape(-1, 6)
        assert len(got) == n
        np.testing.assert_allclose(got[:, :4], dets[:n, :4].numpy(), atol=0.02)


def test_unknown_paths_share_one_metrics_series(gateway):
    for path in ("/v1/no-such-route", "/v1/another/made-up/path"):
        assert httpx.get(f"{gateway.url}{path}").status_code == 404
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'endpoint="other",status="404"' in metrics
    assert "no-such-route" not in metrics and "made-up" not in metrics


def test_200_concurrent_requests_without_errors(gateway, coco48):
    imgs = _coco_images(coco48, 8)

    async def run():
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(limits=limits, timeout=120) as c:
            reqs = [
                c.post(f"{gateway.url}/v1/detect?conf=0.5", content=imgs[i % 8], headers={"Content-Type": "image/jpeg"})
                for i in range(200)
            ]
            return await asyncio.gather(*reqs)

    codes = Counter(r.status_code for r in asyncio.run(run()))
    assert codes == {200: 200}, f"status codes of 200 concurrent requests: {dict(codes)}"
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert "gateway_requests_total" in metrics and "gateway_request_seconds_bucket" in metrics
    assert 'gateway_errors_total{kind="bad_image"}' in metrics


def test_timeout_is_504_and_api_key_is_enforced(triton, coco48):
    good = _coco_images(coco48, 1)[0]
    with GatewayProcess([triton.grpc_url], port=free_port(), timeout_s=0.0005, api_key="s3cret") as gw:
        gw.start()
        assert _post(gw, good).status_code == 401
        # the key is checked before the parameters: a caller without it learns nothing of the API
        assert _post(gw, good, params="conf=5").status_code == 401
        assert _post(gw, good, params="conf=5", headers={"X-API-Key": "s3cret"}).status_code == 422
        r = _post(gw, good, headers={"X-API-Key": "s3cret"})
        assert r.status_code == 504, r.text
        assert httpx.get(f"{gw.url}/healthz").status_code == 200


def test_triton_down_gives_503_then_recovers(triton, gateway, coco48):
    good = _coco_images(coco48, 1)[0]
    assert _post(gateway, good).status_code == 200
    triton.kill()
    try:
        r = httpx.get(f"{gateway.url}/readyz")
        assert r.status_code == 503 and r.headers.get("retry-after")
        r = _post(gateway, good)
        assert r.status_code == 503 and r.headers.get("retry-after") and r.json()["error"] == "unavailable"
    finally:
        triton.start(timeout=180, model="yolov9")
    # each gateway worker reconnects on its own schedule (backoff at most 1 s), and any worker may answer a
    # request or a probe: recovered means several requests and probes in a row succeed
    deadline, codes = time.time() + 30, []
    while time.time() < deadline and codes[-4:] != [(200, 200)] * 4:
        codes.append((_post(gateway, good).status_code, httpx.get(f"{gateway.url}/readyz").status_code))
        time.sleep(0.1)
    assert codes[-4:] == [(200, 200)] * 4, codes


def test_slow_health_checks_take_a_serving_endpoint_out_only_in_a_row(triton):
    """A stopped Triton (its socket still takes connections) answers no health check: a busy server's slow answer
    looks the same, so the endpoint stays in routing until SLOW_CHECKS_BEFORE_DOWN checks in a row time out; a
    refused connection takes it out at once."""

    async def go() -> None:
        pool = TritonPool([triton.grpc_url], "yolov9")
        closed = TritonPool([f"127.0.0.1:{free_port()}"], "yolov9")
        try:
            await pool.check_all()
            e, up = pool.endpoints[0], []
            assert e.healthy
            os.kill(triton.proc.pid, signal.SIGSTOP)
            try:
                for _ in range(SLOW_CHECKS_BEFORE_DOWN):
                    await pool.check_all()
                    up.append((e.healthy, await pool.ready()))
            finally:
                os.kill(triton.proc.pid, signal.SIGCONT)
            assert up == [(True, True)] * (SLOW_CHECKS_BEFORE_DOWN - 1) + [(False, False)]
            deadline = time.monotonic() + 30
            while not e.healthy and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                await pool.check_all()
            assert e.healthy and e.slow_checks == 0
            refused = closed.endpoints[0]
            refused.healthy = True  # as if it had served until its server went away
            await closed.check(refused)
            assert not refused.healthy
        finally:
            await pool.close()
            await closed.close()

    asyncio.run(go())
    time.sleep(2 * Settings().health_interval_s)  # the shared gateway's workers see Triton back before the next test


def test_gateway_app_does_not_load_torch():
    # a worker carrying torch's objects paused each in-flight request for a full garbage-collection pass over them
    code = (
        "import sys; from yolov9.serve.gateway.app import create_app; create_app(); "
        "print(sorted({'torch', 'torchvision'} & set(sys.modules)))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
