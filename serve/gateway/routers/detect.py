"""POST /v1/detect, /v1/detect/batch and /v1/detect/annotated."""

from __future__ import annotations

import asyncio
import io
import time

from fastapi import APIRouter, Depends, Request, UploadFile
from fastapi.responses import JSONResponse, Response

from yolov9.core.image_io import detections_to_json
from yolov9.serve.gateway import metrics
from yolov9.serve.gateway.backend import BackendError
from yolov9.serve.gateway.dependencies import (
    IMAGE_BODY,
    IMAGES_BODY,
    DetectContext,
    detect_context,
    image_hw,
    read_image,
    upload_bytes,
    upload_files,
)
from yolov9.serve.gateway.errors import GatewayError
from yolov9.serve.gateway.schemas import BatchResponse, DetectResponse

router = APIRouter(prefix="/v1/detect")  # behind the API key (app.ApiKeyMiddleware)

# a batch's file that is at fault itself (undecodable, too large, not an image) is answered in its place, so the
# other files' results are not lost; a retry could not fix it, where a 503 or 504 fails the whole batch to retry
IMAGE_FAULTS = frozenset({400, 413, 415})


async def detect_one(request: Request, data: bytes, ctx: DetectContext) -> dict:
    """One image through Triton, as the JSON body of a DetectResponse."""
    p, pool, settings, classes = ctx.query, ctx.pool, ctx.settings, ctx.query.class_ids()
    h, w = image_hw(data)
    state = request.app.state
    if state.in_flight >= settings.max_in_flight:
        raise GatewayError(503, "overloaded", "too many requests in flight", retry_after=1)
    state.in_flight += 1
    metrics.IN_FLIGHT.inc()
    t0 = time.perf_counter()
    try:
        names = await pool.class_names()
        if classes and max(classes) >= len(names):
            bad = sorted(c for c in classes if c >= len(names))
            raise GatewayError(422, "invalid_parameters", f"classes: {bad} not among the model's {len(names)} classes")
        det, version = await pool.detect(data, p.conf, p.iou, p.max_det, classes)
    except BackendError as e:
        raise GatewayError.from_backend(e) from None
    finally:
        state.in_flight -= 1
        metrics.IN_FLIGHT.dec()
    # plain dicts answered as JSONResponse: the response_model stays the documented schema, without a
    # per-detection pydantic validation on the hot path
    return {
        "detections": detections_to_json(det, names),
        "width": w,
        "height": h,
        "latency_ms": round(1000 * (time.perf_counter() - t0), 2),
        "model": settings.model,
        "version": version,
    }


@router.post(
    "",
    response_model=DetectResponse,
    summary="Detect objects in one image (raw body with an image content type, or multipart 'file')",
    openapi_extra=IMAGE_BODY,
)
async def detect(request: Request, ctx: DetectContext = Depends(detect_context)):
    data = await read_image(request, ctx.settings)
    return JSONResponse(await detect_one(request, data, ctx))


@router.post(
    "/batch",
    response_model=BatchResponse,
    summary="Detect objects in several images (multipart 'files'); a file that is itself at fault gets its error in "
    "its place",
    openapi_extra=IMAGES_BODY,
)
async def detect_batch(request: Request, ctx: DetectContext = Depends(detect_context)):
    files = await upload_files(request, ctx.settings)
    metrics.BATCH_SIZE.observe(len(files))

    async def one(name: str, f: UploadFile) -> dict:
        try:
            return await detect_one(request, await upload_bytes(f, ctx.settings.max_upload_bytes), ctx)
        except GatewayError as e:
            if e.status not in IMAGE_FAULTS:  # the service's or the request's: the batch fails as one
                raise
            metrics.ERRORS.labels(kind=e.kind).inc()
            return {"error": e.kind, "detail": f"{name}: {e.detail}", "status": e.status}

    results = await asyncio.gather(*(one(name, f) for name, f in files))
    return JSONResponse({"results": list(results)})


@router.post(
    "/annotated",
    responses={200: {"content": {"image/jpeg": {}}}},
    summary="The image with detected boxes drawn on it (JPEG)",
    openapi_extra=IMAGE_BODY,
)
async def detect_annotated(request: Request, ctx: DetectContext = Depends(detect_context)):
    from PIL import Image

    from yolov9.core.draw import draw_detections, encode_jpeg

    data = await read_image(request, ctx.settings)
    res = await detect_one(request, data, ctx)
    out = draw_detections(Image.open(io.BytesIO(data)), res["detections"])
    return Response(encode_jpeg(out), media_type="image/jpeg")
