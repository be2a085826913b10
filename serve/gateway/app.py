"""The FastAPI inference gateway in front of Triton.

Configuration comes from the environment (set by `yolov9 serve gateway`): YOLOV9_TRITON_URLS (comma list of gRPC
endpoints), YOLOV9_MODEL, YOLOV9_MAX_UPLOAD_BYTES, YOLOV9_MAX_IN_FLIGHT, YOLOV9_TIMEOUT_S and, for optional
API-key auth, YOLOV9_API_KEY (clients send it as the X-API-Key header)."""

from __future__ import annotations

import asyncio
import gc
import os
import secrets
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import Depends, FastAPI, File, Query, Request, UploadFile
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from core.image_io import ImageError, detections_to_json, image_size
from serve.gateway import metrics
from serve.gateway.backend import BackendError, TritonPool

ACCEPTED_TYPES = {"image/jpeg", "image/png", "image/webp", "image/bmp", "application/octet-stream"}


@dataclass
class Settings:
    triton_urls: list[str] = field(
        default_factory=lambda: os.environ.get("YOLOV9_TRITON_URLS", "127.0.0.1:8001").split(",")
    )
    model: str = field(default_factory=lambda: os.environ.get("YOLOV9_MODEL", "yolov9"))
    max_upload_bytes: int = field(default_factory=lambda: int(os.environ.get("YOLOV9_MAX_UPLOAD_BYTES", 20 * 2**20)))
    max_in_flight: int = field(default_factory=lambda: int(os.environ.get("YOLOV9_MAX_IN_FLIGHT", 512)))
    timeout_s: float = field(default_factory=lambda: float(os.environ.get("YOLOV9_TIMEOUT_S", 30)))
    api_key: str | None = field(default_factory=lambda: os.environ.get("YOLOV9_API_KEY") or None)
    max_batch_images: int = 64


class Detection(BaseModel):
    box: list[float] = Field(description="x1, y1, x2, y2 in original-image pixels")
    score: float
    class_id: int
    class_name: str


class DetectResponse(BaseModel):
    detections: list[Detection]
    width: int
    height: int
    latency_ms: float


class BatchResponse(BaseModel):
    results: list[DetectResponse]


class ErrorBody(BaseModel):
    error: str
    detail: str


@dataclass
class DetectParams:
    conf: float
    iou: float
    max_det: int
    classes: list[int] | None


async def detect_params(
    conf: float = Query(0.25, ge=0.0, le=1.0, description="score threshold"),
    iou: float = Query(0.45, gt=0.0, le=1.0, description="NMS IoU threshold"),
    max_det: int = Query(100, ge=1, le=1000, description="maximum detections per image"),
    classes: str | None = Query(None, pattern=r"^\d+(,\d+)*$", description="comma-separated class ids to keep"),
) -> DetectParams:
    """Query parameters shared by the detect endpoints (bad values are answered with 422). Async, like every
    dependency here: FastAPI runs sync ones in a thread pool, a thread hop per request."""
    return DetectParams(conf, iou, max_det, [int(c) for c in classes.split(",")] if classes else None)


class ObserveMiddleware:
    """Request count and latency per /v1 endpoint, as plain ASGI (Starlette's BaseHTTPMiddleware costs a task
    and a stream per request)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            metrics.REQUESTS.labels(endpoint=scope["path"], status=str(status[0])).inc()
            metrics.LATENCY.labels(endpoint=scope["path"]).observe(time.perf_counter() - t0)


class GatewayError(Exception):
    def __init__(self, status: int, kind: str, detail: str, retry_after: int | None = None):
        self.status, self.kind, self.detail, self.retry_after = status, kind, detail, retry_after


_STATUS = {"bad_image": 400, "unavailable": 503, "timeout": 504, "internal": 500}


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.pool = TritonPool(settings.triton_urls, settings.model, settings.timeout_s)
        app.state.in_flight = 0
        # what exists now lives as long as the worker: keep it out of the collector's full passes, which would
        # otherwise walk all of it while every request in flight on this worker waits
        gc.collect()
        gc.freeze()
        yield
        await app.state.pool.close()

    app = FastAPI(
        title="yolov9-trt gateway",
        version="0.1.0",
        lifespan=lifespan,
        description="Object detection over HTTP: images in, boxes out. Backed by Triton Inference Server.",
        responses={
            400: {"model": ErrorBody},
            413: {"model": ErrorBody},
            415: {"model": ErrorBody},
            503: {"model": ErrorBody},
            504: {"model": ErrorBody},
        },
    )

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, e: GatewayError):
        metrics.ERRORS.labels(kind=e.kind).inc()
        headers = {"Retry-After": str(e.retry_after)} if e.retry_after else None
        return JSONResponse({"error": e.kind, "detail": e.detail}, status_code=e.status, headers=headers)

    app.add_middleware(ObserveMiddleware)

    async def require_key(request: Request) -> None:
        if settings.api_key and not secrets.compare_digest(request.headers.get("x-api-key", ""), settings.api_key):
            raise GatewayError(401, "unauthorized", "missing or wrong X-API-Key header")

    async def read_image(request: Request, file: UploadFile | None) -> bytes:
        """The image from a multipart 'file' field or the raw body, size- and type-checked."""
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > settings.max_upload_bytes + 4096:
            raise GatewayError(413, "too_large", f"upload over {settings.max_upload_bytes} bytes")
        if file is not None:
            ctype = (file.content_type or "application/octet-stream").split(";")[0]
            data = await file.read(settings.max_upload_bytes + 1)
        else:
            ctype = request.headers.get("content-type", "application/octet-stream").split(";")[0].strip()
            data = bytearray()
            async for chunk in request.stream():
                data += chunk
                if len(data) > settings.max_upload_bytes:
                    break
            data = bytes(data)
        if ctype not in ACCEPTED_TYPES:
            raise GatewayError(
                415, "unsupported_type", f"content type {ctype} is not an image ({', '.join(sorted(ACCEPTED_TYPES))})"
            )
        if len(data) > settings.max_upload_bytes:
            raise GatewayError(413, "too_large", f"upload over {settings.max_upload_bytes} bytes")
        if not data:
            raise GatewayError(400, "bad_image", "empty body: send an image as the body or a multipart 'file'")
        return data

    def check_image(data: bytes) -> tuple[int, int]:
        try:
            return image_size(data)
        except ImageError as e:
            status, kind = (413, "too_large") if "limit" in str(e) else (400, "bad_image")
            raise GatewayError(status, kind, str(e)) from None

    async def detect_one(data: bytes, p: DetectParams) -> dict:
        h, w = check_image(data)
        if app.state.in_flight >= settings.max_in_flight:
            raise GatewayError(503, "overloaded", "too many requests in flight", retry_after=1)
        app.state.in_flight += 1
        metrics.IN_FLIGHT.inc()
        t0 = time.perf_counter()
        try:
            det = await app.state.pool.detect(data, p.conf, p.iou, p.max_det, p.classes)
            names = await app.state.pool.class_names()
        except BackendError as e:
            raise GatewayError(
                _STATUS[e.kind], e.kind, str(e), retry_after=2 if e.kind == "unavailable" else None
            ) from None
        finally:
            app.state.in_flight -= 1
            metrics.IN_FLIGHT.dec()
        # plain dicts answered as JSONResponse: the response_model stays the documented schema, without a
        # per-detection pydantic validation on the hot path
        return {
            "detections": detections_to_json(det, names),
            "width": w,
            "height": h,
            "latency_ms": round(1000 * (time.perf_counter() - t0), 2),
        }

    @app.post(
        "/v1/detect",
        response_model=DetectResponse,
        dependencies=[Depends(require_key)],
        summary="Detect objects in one image (multipart 'file' or raw image body)",
    )
    async def detect(
        request: Request, params: DetectParams = Depends(detect_params), file: UploadFile | None = File(None)
    ):
        return JSONResponse(await detect_one(await read_image(request, file), params))

    @app.post(
        "/v1/detect/batch",
        response_model=BatchResponse,
        dependencies=[Depends(require_key)],
        summary="Detect objects in several images (multipart 'files')",
    )
    async def detect_batch(params: DetectParams = Depends(detect_params), files: list[UploadFile] = File(...)):
        if len(files) > settings.max_batch_images:
            raise GatewayError(413, "too_large", f"at most {settings.max_batch_images} images per request")
        blobs = []
        for f in files:
            ctype = (f.content_type or "application/octet-stream").split(";")[0]
            if ctype not in ACCEPTED_TYPES:
                raise GatewayError(415, "unsupported_type", f"{f.filename}: content type {ctype} is not an image")
            data = await f.read(settings.max_upload_bytes + 1)
            if len(data) > settings.max_upload_bytes:
                raise GatewayError(413, "too_large", f"{f.filename}: over {settings.max_upload_bytes} bytes")
            blobs.append(data)
        metrics.BATCH_SIZE.observe(len(blobs))
        results = await asyncio.gather(*(detect_one(b, params) for b in blobs))
        return JSONResponse({"results": list(results)})

    @app.post(
        "/v1/detect/annotated",
        dependencies=[Depends(require_key)],
        responses={200: {"content": {"image/jpeg": {}}}},
        summary="The image with detected boxes drawn on it (JPEG)",
    )
    async def detect_annotated(
        request: Request, params: DetectParams = Depends(detect_params), file: UploadFile | None = File(None)
    ):
        import io

        from PIL import Image

        from core.draw import draw_detections, encode_jpeg

        data = await read_image(request, file)
        res = await detect_one(data, params)
        img = Image.open(io.BytesIO(data))
        out = draw_detections(img, res["detections"])
        return Response(encode_jpeg(out), media_type="image/jpeg")

    @app.get("/v1/models", summary="The served model, its classes and its Triton configuration")
    async def models():
        try:
            cfg = await app.state.pool.model_info()
            names = await app.state.pool.class_names()
        except BackendError as e:
            raise GatewayError(_STATUS[e.kind], e.kind, str(e), retry_after=2) from None
        return {
            "models": [
                {
                    "name": settings.model,
                    "classes": names,
                    "backend": cfg.get("backend") or cfg.get("platform"),
                    "max_batch_size": cfg.get("max_batch_size"),
                    "endpoints": settings.triton_urls,
                }
            ]
        }

    @app.get("/healthz", summary="Liveness: the gateway process answers")
    async def healthz():
        return {"status": "ok"}

    @app.get("/readyz", summary="Readiness: a Triton endpoint is reachable and the model is ready")
    async def readyz():
        if await app.state.pool.ready():
            return {"status": "ready"}
        raise GatewayError(503, "unavailable", "Triton unreachable or model not ready", retry_after=2)

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus():
        body, ctype = metrics.render()
        return Response(body, media_type=ctype)

    return app


app = create_app  # uvicorn --factory serve.gateway.app:app
