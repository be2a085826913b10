"""POST /v1/detect, /v1/detect/batch and /v1/detect/annotated."""

from __future__ import annotations

import asyncio
import io
import time

from fastapi import APIRouter, Depends, Request
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
    read_images,
)
from yolov9.serve.gateway.errors import GatewayError
from yolov9.serve.gateway.schemas import BatchResponse, DetectResponse

router = APIRouter(prefix="/v1/detect")  # behind the API key (app.ApiKeyMiddleware)


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
    summary="Detect objects in several images (multipart 'files')",
    openapi_extra=IMAGES_BODY,
)
async def detect_batch(request: Request, ctx: DetectContext = Depends(detect_context)):
    blobs = await read_images(request, ctx.settings)
    metrics.BATCH_SIZE.observe(len(blobs))

    async def named(name: str, data: bytes) -> dict:
        try:
            return await detect_one(request, data, ctx)
        except GatewayError as e:  # the batch fails as one; its error says which image
            raise GatewayError(e.status, e.kind, f"{name}: {e.detail}", e.retry_after) from None

    results = await asyncio.gather(*(named(name, data) for name, data in blobs))
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
