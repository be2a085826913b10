"""Every error answers with the same body, {"error": kind, "detail": one line}, and is counted by kind."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from yolov9.serve.gateway import metrics
from yolov9.serve.gateway.backend import BackendError

BACKEND_STATUS = {"bad_image": 400, "invalid_parameters": 422, "unavailable": 503, "timeout": 504, "internal": 500}


class GatewayError(Exception):
    def __init__(self, status: int, kind: str, detail: str, retry_after: int | None = None):
        self.status, self.kind, self.detail, self.retry_after = status, kind, detail, retry_after

    @classmethod
    def from_backend(cls, e: BackendError) -> GatewayError:
        return cls(BACKEND_STATUS[e.kind], e.kind, str(e), retry_after=2 if e.kind == "unavailable" else None)


def error_response(e: GatewayError) -> JSONResponse:
    """The one error body, counted by kind (also answered by the ASGI layers, outside the routes' handlers)."""
    metrics.ERRORS.labels(kind=e.kind).inc()
    headers = {"Retry-After": str(e.retry_after)} if e.retry_after else None
    return JSONResponse({"error": e.kind, "detail": e.detail}, status_code=e.status, headers=headers)


async def _gateway_error(request: Request, e: GatewayError) -> JSONResponse:
    return error_response(e)


async def _invalid_parameters(request: Request, e: RequestValidationError) -> JSONResponse:
    metrics.ERRORS.labels(kind="invalid_parameters").inc()
    parts = [f"{'.'.join(str(x) for x in err['loc'][1:]) or err['loc'][0]}: {err['msg']}" for err in e.errors()]
    return JSONResponse({"error": "invalid_parameters", "detail": "; ".join(parts)}, status_code=422)


def install(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _invalid_parameters)
