"""What the routes share, as FastAPI dependencies: settings, the Triton pool, the API key check, the detect
parameters and the uploaded image. All async: FastAPI runs sync dependencies in a thread pool, a thread hop per
request."""

from __future__ import annotations

import secrets

from fastapi import Depends, File, Query, Request, UploadFile

from yolov9.core.image_io import ImageError, image_size
from yolov9.serve.gateway.backend import TritonPool
from yolov9.serve.gateway.errors import GatewayError
from yolov9.serve.gateway.schemas import DetectParams
from yolov9.serve.gateway.settings import Settings, get_settings

ACCEPTED_TYPES = {"image/jpeg", "image/png", "image/webp", "image/bmp", "application/octet-stream"}


def get_pool(request: Request) -> TritonPool:
    return request.app.state.pool


async def require_key(request: Request, settings: Settings = Depends(get_settings)) -> None:
    if settings.api_key and not secrets.compare_digest(request.headers.get("x-api-key", ""), settings.api_key):
        raise GatewayError(401, "unauthorized", "missing or wrong X-API-Key header")


async def detect_params(
    conf: float = Query(0.25, ge=0.0, le=1.0, description="score threshold"),
    iou: float = Query(0.45, gt=0.0, le=1.0, description="NMS IoU threshold"),
    max_det: int = Query(100, ge=1, le=1000, description="maximum detections per image"),
    classes: str | None = Query(None, pattern=r"^\d+(,\d+)*$", description="comma-separated class ids to keep"),
) -> DetectParams:
    """Query parameters shared by the detect endpoints (bad values are answered with 422)."""
    return DetectParams(conf, iou, max_det, [int(c) for c in classes.split(",")] if classes else None)


def check_content_type(ctype: str, what: str = "content type") -> None:
    if ctype not in ACCEPTED_TYPES:
        raise GatewayError(
            415, "unsupported_type", f"{what} {ctype} is not an image ({', '.join(sorted(ACCEPTED_TYPES))})"
        )


async def read_image(
    request: Request, file: UploadFile | None = File(None), settings: Settings = Depends(get_settings)
) -> bytes:
    """The image from a multipart 'file' field or the raw body, size- and type-checked."""
    limit = settings.max_upload_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + 4096:
        raise GatewayError(413, "too_large", f"upload over {limit} bytes")
    if file is not None:
        ctype = (file.content_type or "application/octet-stream").split(";")[0]
        data = await file.read(limit + 1)
    else:
        ctype = request.headers.get("content-type", "application/octet-stream").split(";")[0].strip()
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                break
        data = bytes(body)
    check_content_type(ctype)
    if len(data) > limit:
        raise GatewayError(413, "too_large", f"upload over {limit} bytes")
    if not data:
        raise GatewayError(400, "bad_image", "empty body: send an image as the body or a multipart 'file'")
    return data


def image_hw(data: bytes) -> tuple[int, int]:
    """(height, width) from the header, or the 400/413 that the image deserves."""
    try:
        return image_size(data)
    except ImageError as e:
        status, kind = (413, "too_large") if "limit" in str(e) else (400, "bad_image")
        raise GatewayError(status, kind, str(e)) from None
