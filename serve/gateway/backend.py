"""The gateway's side of Triton: one async gRPC client per endpoint, each health-checked in the background, requests
sent to the healthy endpoint with the fewest outstanding, a request that fails on one endpoint (down, timed out)
retried once on another, and the model version each endpoint serves.

Versions: a deployment adds Triton models `<name>__v<k>` beside `<name>` (version 1) and unloads the one it
replaces (serve/deploy.py); each endpoint serves the highest version it has ready, so traffic moves to a new
version once it answers and back when a rollback unloads it."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from dataclasses import dataclass, field

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc

from yolov9.core.detection_defaults import CONF, IOU, MAX_DET
from yolov9.core.errors import BadInput
from yolov9.serve.gateway import metrics


class BackendError(Exception):
    """kind: 'unavailable' (503), 'timeout' (504), 'bad_image' (400), 'invalid_parameters' (422), 'internal' (500)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def classify(e: Exception) -> BackendError:
    # a gRPC error's own text is a multi-line dump; its status and Triton's message say it all
    msg = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.aio.AioRpcError) else str(e)
    low = msg.lower()
    if "bad image" in low:
        return BackendError("bad_image", msg.split("bad image:", 1)[-1].strip())
    if "invalid parameters:" in low:  # the model checks each request's parameters too (a Triton-direct client)
        return BackendError("invalid_parameters", msg.split("invalid parameters:", 1)[-1].strip())
    if "deadline" in low or "timeout" in low or "timed out" in low:
        return BackendError("timeout", "inference timed out")
    if any(w in low for w in ("unavailable", "connect", "queue", "not ready", "exceeds", "unknown model", "not found")):
        return BackendError("unavailable", "inference server unavailable or its queue is full")
    return BackendError("internal", msg[:300])


def model_name(base: str, version: int) -> str:
    """The Triton model that holds version `version` of model `base`."""
    return base if version == 1 else f"{base}__v{version}"


def version_of(triton_model: str, base: str) -> int | None:
    if triton_model == base:
        return 1
    m = re.fullmatch(re.escape(base) + r"__v(\d+)", triton_model)
    return int(m.group(1)) if m else None


@dataclass
class Endpoint:
    """One Triton server as this worker sees it: tritonclient's client for health and configuration, and the
    inference service's own stub for detect requests (built as Triton's protobuf message directly: no per-request
    wrapper objects, no copy of the image into an array)."""

    url: str
    client: grpcclient.InferenceServerClient
    infer: rpc.GRPCInferenceServiceStub
    metrics_url: str | None = None
    healthy: bool = False
    slow_checks: int = 0  # health checks in a row that timed out while it was up
    versions: dict[int, str] = field(default_factory=dict)  # version -> state, from the repository index
    outstanding: int = 0
    requests: int = 0
    errors: int = 0
    latency_ms: float | None = None  # exponentially weighted

    @property
    def serving(self) -> int | None:
        ready = [v for v, state in self.versions.items() if state == "READY"]
        return max(ready) if ready else None

    def summary(self) -> dict:
        return {
            "url": self.url,
            "state": "up" if self.healthy else "down",
            "serving_version": self.serving,
            "outstanding": self.outstanding,
            "requests": self.requests,
            "errors": self.errors,
            "latency_ms": round(self.latency_ms, 2) if self.latency_ms is not None else None,
        }


# a health check that times out is a busy server as often as a hung one: an endpoint that was up stays in routing
# until this many in a row have (a refused connection or an error answer takes it out at once)
SLOW_CHECKS_BEFORE_DOWN = 3

# short reconnect backoff: after a Triton restart the gateway recovers within about a second
CHANNEL_ARGS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_send_message_length", 64 * 2**20),
    ("grpc.max_receive_message_length", 64 * 2**20),
]


class TritonPool:
    def __init__(
        self,
        urls: list[str],
        model: str,
        timeout_s: float = 30.0,
        health_interval_s: float = 0.5,
        metrics_urls: list[str] | None = None,
    ):
        if not urls:
            raise BadInput("no Triton endpoint given")
        self.model, self.timeout_s, self.health_interval_s = model, timeout_s, health_interval_s
        metrics_urls = metrics_urls or [None] * len(urls)
        self.endpoints = [
            Endpoint(u, grpcclient.InferenceServerClient(u, channel_args=CHANNEL_ARGS), infer_stub(u), m)
            for u, m in zip(urls, metrics_urls)
        ]
        self._rr = itertools.count()
        self.names: list[str] | None = None
        self._task: asyncio.Task | None = None

    async def start(self, wait_s: float = 0.0) -> None:
        """Health checks until an endpoint serves the model or wait_s has passed, then one every
        health_interval_s in the background. A worker starts accepting connections only after this: one that had
        not reached Triton yet would answer its first requests with 503 while the others serve."""
        deadline = time.monotonic() + wait_s
        await self.check_all()
        while not await self.ready() and time.monotonic() < deadline:
            await asyncio.sleep(min(0.2, self.health_interval_s))
            await self.check_all()
        self._task = asyncio.create_task(self._watch())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await asyncio.gather(*(e.client.close() for e in self.endpoints), return_exceptions=True)
        await asyncio.gather(*(e.infer.channel.close() for e in self.endpoints), return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.check_all()

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(e) for e in self.endpoints))
        if await self.ready():
            metrics.WORKER_READY_AT.set(time.time())

    async def check(self, e: Endpoint) -> None:
        """Healthy: the server answers and holds a ready version of the model; an endpoint that was healthy is
        taken out by an error answer or a refused connection at once, by timeouts after SLOW_CHECKS_BEFORE_DOWN in a
        row (one slow answer under load would take a serving endpoint out of routing and make /readyz 503)."""
        try:
            index = await e.client.get_model_repository_index(client_timeout=max(self.health_interval_s, 1.0))
            versions = {}
            for m in index.models:
                v = version_of(m.name, self.model)
                if v is not None:
                    versions[v] = m.state or "UNAVAILABLE"
            e.versions = versions
            e.healthy, e.slow_checks = e.serving is not None, 0
        except Exception as err:
            if e.healthy and classify(err).kind == "timeout" and e.slow_checks + 1 < SLOW_CHECKS_BEFORE_DOWN:
                e.slow_checks += 1
            else:
                e.healthy, e.versions, e.slow_checks = False, {}, 0
        metrics.ENDPOINT_UP.labels(endpoint=e.url).set(1 if e.healthy else 0)

    def _pick(self, exclude: Endpoint | None = None) -> Endpoint:
        """The healthy endpoint with the fewest requests outstanding (ties taken in turn)."""
        up = [e for e in self.endpoints if e.healthy and e is not exclude]
        if not up:
            raise BackendError("unavailable", "no Triton endpoint is serving the model")
        least = min(e.outstanding for e in up)
        tied = [e for e in up if e.outstanding == least]
        return tied[next(self._rr) % len(tied)]

    async def ready(self) -> bool:
        return any(e.healthy for e in self.endpoints)

    async def model_info(self) -> dict:
        last: Exception | None = None
        for e in sorted(self.endpoints, key=lambda e: not e.healthy):
            try:
                name = model_name(self.model, e.serving or 1)
                cfg = await e.client.get_model_config(name, as_json=True, client_timeout=5)
                return cfg["config"]
            except Exception as err:
                last = err
        raise classify(last or RuntimeError("unavailable"))

    async def class_names(self) -> list[str]:
        if self.names is None:
            cfg = await self.model_info()
            engine_names = cfg.get("parameters", {}).get("names", {}).get("string_value")
            self.names = json.loads(engine_names) if engine_names else []
        return self.names

    async def decoders(self) -> list[dict[str, int] | None]:
        """Per endpoint, the JPEG decoders its model instances use and how many use each (from the
        yolov9_decoder_info metric the Triton model publishes); None where its metrics cannot be read."""
        import httpx

        async def one(e: Endpoint) -> dict[str, int] | None:
            if not e.metrics_url:
                return None
            try:
                async with httpx.AsyncClient(timeout=2) as client:
                    text = (await client.get(e.metrics_url)).text
            except httpx.HTTPError:
                return None
            return decoder_counts(text, self.model)

        return list(await asyncio.gather(*(one(e) for e in self.endpoints)))

    def versions(self) -> list[dict]:
        """Every version any endpoint knows, its state there, and which one serves."""
        seen: dict[int, set[str]] = {}
        for e in self.endpoints:
            for v, state in e.versions.items():
                seen.setdefault(v, set()).add(state)
        serving = {e.serving for e in self.endpoints if e.healthy}
        return [{"version": v, "states": sorted(states), "serving": v in serving} for v, states in sorted(seen.items())]

    async def detect(self, data: bytes, conf: float, iou: float, max_det: int, classes: list[int] | None):
        """((n, 6) detections x1, y1, x2, y2, score, class in original pixels, version). A request that fails
        because its endpoint is down or timed out is retried once on another; that endpoint is taken out until
        its health check passes."""
        request = triton_request(data, conf, iou, max_det, classes)
        first = self._pick()
        try:
            return await self._infer(first, request)
        except BackendError as err:
            if err.kind not in ("unavailable", "timeout"):
                raise
            await self.check(first)  # down (taken out), or serving another version now (a roll-out)
            metrics.RETRIES.inc()
            others = [e for e in self.endpoints if e.healthy and e is not first]
            if not others and not first.healthy:
                raise
            return await self._infer(self._pick(exclude=first) if others else first, request)

    async def _infer(self, e: Endpoint, request: pb.ModelInferRequest):
        version = e.serving or 1
        request.model_name = model_name(self.model, version)
        e.outstanding += 1
        e.requests += 1
        t0 = time.perf_counter()
        try:
            r = await e.infer.ModelInfer(request, timeout=self.timeout_s)
        except Exception as err:  # grpc channel errors surface as other types than InferenceServerException
            e.errors += 1
            metrics.child(metrics.ENDPOINT_ERRORS, e.url).inc()
            raise classify(err) from None
        finally:
            e.outstanding -= 1
        ms = 1000 * (time.perf_counter() - t0)
        e.latency_ms = ms if e.latency_ms is None else 0.9 * e.latency_ms + 0.1 * ms
        metrics.child(metrics.ENDPOINT_LATENCY, e.url).observe(ms / 1000)
        metrics.child(metrics.ENDPOINT_REQUESTS, e.url).inc()
        return read_detections(r), version


_DECODER_LINE = re.compile(r"^yolov9_decoder_info\{([^}]*)\}\s+([0-9.eE+-]+)", re.M)


def decoder_counts(metrics_text: str, base: str) -> dict[str, int]:
    """{decoder: instances} for model `base` and its versions, from Triton's Prometheus text."""
    out: dict[str, int] = {}
    for labels, value in _DECODER_LINE.findall(metrics_text):
        kv = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if version_of(kv.get("model", ""), base) is not None and "decoder" in kv:
            out[kv["decoder"]] = out.get(kv["decoder"], 0) + int(float(value))
    return out


def infer_stub(url: str) -> rpc.GRPCInferenceServiceStub:
    """Triton's inference service on its own channel; the channel is kept as `.channel` to close it."""
    channel = grpc.aio.insecure_channel(url, options=CHANNEL_ARGS)
    stub = rpc.GRPCInferenceServiceStub(channel)
    stub.channel = channel
    return stub


_PARAMS = (
    ("CONF", "FP32", np.float32, CONF),
    ("IOU", "FP32", np.float32, IOU),
    ("MAX_DET", "INT32", np.int32, MAX_DET),
)


def triton_request(
    data: bytes, conf: float = CONF, iou: float = IOU, max_det: int = MAX_DET, classes: list[int] | None = None
) -> pb.ModelInferRequest:
    """One detect request to the Triton model as the gRPC message (its model_name set by the sender): the encoded
    image as it came and the parameters, raw. A parameter at the model's own default is left out: each input is
    one more tensor for Triton and the model's stub to pass along, per request."""
    request = pb.ModelInferRequest()
    request.inputs.add(name="IMAGE", datatype="UINT8", shape=[1, len(data)])
    raw = [data]
    for (name, kind, dtype, default), value in zip(_PARAMS, (conf, iou, max_det)):
        if value != default:
            request.inputs.add(name=name, datatype=kind, shape=[1, 1])
            raw.append(np.array(value, dtype).tobytes())
    if classes:
        request.inputs.add(name="CLASSES", datatype="INT32", shape=[1, len(classes)])
        raw.append(np.array(classes, np.int32).tobytes())
    request.raw_input_contents.extend(raw)
    request.outputs.add(name="DETECTIONS")
    request.outputs.add(name="NUM_DETS")
    return request


def read_detections(response: pb.ModelInferResponse) -> np.ndarray:
    """(n, 6) x1, y1, x2, y2, score, class from the model's answer (its DETECTIONS rows past NUM_DETS are padding)."""
    raw = dict(zip((o.name for o in response.outputs), response.raw_output_contents))
    n = int(np.frombuffer(raw["NUM_DETS"], np.int32)[0])
    return np.frombuffer(raw["DETECTIONS"], np.float32).reshape(-1, 6)[:n]
