"""What the routes share: settings, the Triton pool, the detect parameters and the uploaded image.
The dependencies are async (FastAPI runs a plain `def` dependency in its thread pool, a thread hop per request), and
the detect routes take one (`detect_context`): FastAPI's dependency solving is most of the gateway's own time per
request, so the hot path keeps its dependency tree one node deep."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request, UploadFile
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from yolov9.core.image_io import ImageError, image_size
from yolov9.serve.gateway.backend import TritonPool
from yolov9.serve.gateway.errors import GatewayError
from yolov9.serve.gateway.schemas import DetectQuery
from yolov9.serve.gateway.settings import Settings

ACCEPTED_TYPES = {"image/jpeg", "image/png", "image/webp", "image/bmp", "application/octet-stream"}


# async on purpose: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per request
async def get_pool(request: Request) -> TritonPool:
    return request.app.state.pool


async def app_settings(request: Request) -> Settings:
    """The settings the app was made with (not FastAPI's dependency_overrides: with any override present, FastAPI
    re-analyses every dependency of every request)."""
    return request.app.state.settings


@dataclass
class DetectContext:
    query: DetectQuery
    settings: Settings
    pool: TritonPool


async def detect_context(request: Request) -> DetectContext:
    """What every detect route needs: its parameters, the settings and the pool. The query is validated here in
    one pydantic call: as a FastAPI `Query()` model, FastAPI re-inspected every field's annotation on every request
    (the routes document the parameters through QUERY_PARAMETERS instead)."""
    try:
        query = DetectQuery.model_validate(dict(request.query_params))
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("query", *err["loc"])} for err in e.errors()]) from None
    return DetectContext(query, request.app.state.settings, request.app.state.pool)


def _query_parameters(model: type[BaseModel]) -> list[dict]:
    """A model's fields as OpenAPI query parameters (what FastAPI writes for a `Query()` model)."""
    schema = model.model_json_schema()
    return [
        {
            "name": name,
            "in": "query",
            "required": name in schema.get("required", []),
            "description": prop.get("description", ""),
            "schema": {k: v for k, v in prop.items() if k != "description"},
        }
        for name, prop in schema["properties"].items()
    ]


QUERY_PARAMETERS = _query_parameters(DetectQuery)


def check_content_type(ctype: str, what: str = "content type") -> None:
    if ctype not in ACCEPTED_TYPES:
        raise GatewayError(
            415, "unsupported_type", f"{what} {ctype} is not an image ({', '.join(sorted(ACCEPTED_TYPES))})"
        )


CURL_FORM_HINT = (
    "the body came as application/x-www-form-urlencoded (curl's default for --data-binary): send the image with "
    "-H 'Content-Type: image/jpeg' (its own type), or as multipart -F file=@image.jpg"
)


def content_type(request: Request) -> str:
    return request.headers.get("content-type", "application/octet-stream").split(";")[0].strip().lower()


def check_declared_size(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + 4096:
        raise GatewayError(413, "too_large", f"upload over {limit} bytes")


async def multipart_files(request: Request, field: str, limit: int) -> list[UploadFile]:
    """The uploaded files of one multipart field; a missing field, or text where a file belongs, is a 400 that
    says what to send."""
    form = await request.form()
    items = form.getlist(field)
    example = f"-F {field}=@image.jpg" + (f" -F {field}=@other.jpg" if field == "files" else "")
    if not items:
        others = sorted(set(form.keys()))
        found = f"fields {', '.join(repr(k) for k in others)} but" if others else "no fields and"
        raise GatewayError(400, "bad_request", f"multipart body with {found} no '{field}': send {example}")
    if any(isinstance(x, str) for x in items):
        raise GatewayError(400, "bad_request", f"'{field}' holds text, not a file: send {example} (mind the @)")
    return items


async def upload_bytes(f: UploadFile, limit: int) -> bytes:
    check_content_type((f.content_type or "application/octet-stream").split(";")[0])
    data = await f.read(limit + 1)
    if len(data) > limit:
        raise GatewayError(413, "too_large", f"over {limit} bytes")
    return data


async def read_image(request: Request, settings: Settings) -> bytes:
    """The image: the raw body (its content type an image type), or the multipart field 'file'; size- and
    type-checked, and a form body that is not a file upload told how to send the image."""
    limit = settings.max_upload_bytes
    check_declared_size(request, limit)
    ctype = content_type(request)
    if ctype == "multipart/form-data":
        (f,) = (await multipart_files(request, "file", limit))[:1]
        try:
            data = await upload_bytes(f, limit)
        except GatewayError as e:
            raise GatewayError(e.status, e.kind, f"{f.filename or 'file'}: {e.detail}") from None
    elif ctype == "application/x-www-form-urlencoded":
        raise GatewayError(415, "unsupported_type", CURL_FORM_HINT)
    else:
        check_content_type(ctype)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise GatewayError(413, "too_large", f"upload over {limit} bytes")
        data = bytes(body)
    if not data:
        raise GatewayError(400, "bad_image", "empty body: send an image as the body or a multipart 'file'")
    return data


async def upload_files(request: Request, settings: Settings) -> list[tuple[str, UploadFile]]:
    """The files of the multipart field 'files' (the batch endpoint), each with the name its errors give:
    files[k] and the file's own name."""
    if content_type(request) != "multipart/form-data":
        raise GatewayError(415, "unsupported_type", "send the images as multipart: -F files=@a.jpg -F files=@b.jpg")
    files = await multipart_files(request, "files", settings.max_upload_bytes)
    if len(files) > settings.max_batch_images:
        raise GatewayError(413, "too_large", f"at most {settings.max_batch_images} images per request")
    return [(f"files[{k}] ({f.filename})" if f.filename else f"files[{k}]", f) for k, f in enumerate(files)]


# the request bodies and query parameters the OpenAPI page documents (the routes read them themselves, to answer
# mistakes in words)
IMAGE_BODY = {
    "parameters": QUERY_PARAMETERS,
    "requestBody": {
        "required": True,
        "content": {
            "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
            "image/png": {"schema": {"type": "string", "format": "binary"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {"file": {"type": "string", "format": "binary"}},
                }
            },
        },
    },
}
IMAGES_BODY = {
    "parameters": QUERY_PARAMETERS,
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["files"],
                    "properties": {"files": {"type": "array", "items": {"type": "string", "format": "binary"}}},
                }
            }
        },
    },
}


def image_hw(data: bytes) -> tuple[int, int]:
    """(height, width) from the header, or the 400/413 that the image deserves."""
    try:
        return image_size(data)
    except ImageError as e:
        status, kind = (413, "too_large") if "limit" in str(e) else (400, "bad_image")
        raise GatewayError(status, kind, str(e)) from None
