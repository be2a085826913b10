"""GET / (a page to try the detector), /v1/models, /healthz, /readyz and /metrics."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse, Response

from yolov9.serve.gateway import metrics
from yolov9.serve.gateway.backend import BackendError, TritonPool
from yolov9.serve.gateway.dependencies import app_settings, get_pool
from yolov9.serve.gateway.errors import GatewayError
from yolov9.serve.gateway.settings import Settings

router = APIRouter()
PAGE = Path(__file__).resolve().parents[1] / "static" / "index.html"


@router.get("/", include_in_schema=False)
async def page():
    """A page to try the detector in a browser: pick or drop an image, see the boxes (no build step, no CDN)."""
    return HTMLResponse(PAGE.read_text())


@router.get("/v1/models", summary="The served model, its classes and its Triton configuration")
async def models(pool: TritonPool = Depends(get_pool), settings: Settings = Depends(app_settings)):
    try:
        cfg = await pool.model_info()
        names = await pool.class_names()
    except BackendError as e:
        raise GatewayError.from_backend(e) from None
    endpoints = [{**e.summary(), "decoders": d} for e, d in zip(pool.endpoints, await pool.decoders())]
    return {
        "models": [
            {
                "name": settings.model,
                "classes": names,
                "backend": cfg.get("backend") or cfg.get("platform"),
                "max_batch_size": cfg.get("max_batch_size"),
                "img_size": int(cfg.get("parameters", {}).get("img_size", {}).get("string_value", 0)) or None,
                "versions": pool.versions(),
                "endpoints": endpoints,
            }
        ]
    }


@router.get("/healthz", summary="Liveness: the gateway process answers")
async def healthz():
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: every gateway worker reaches a Triton endpoint that serves the model",
    description="503 while the worker answering cannot reach Triton, or while any other worker has not (starting, "
    "hung or cut off: no successful health check within ready_max_age_s).",
)
async def readyz(pool: TritonPool = Depends(get_pool), settings: Settings = Depends(app_settings)):
    await pool.check_all()  # asked now, not from the last background check
    if not await pool.ready():
        raise GatewayError(503, "unavailable", "Triton unreachable or model not ready", retry_after=2)
    ready = metrics.workers_ready(settings.ready_max_age_s)
    if ready is None:  # one process: this worker is the gateway
        return {"status": "ready", "workers_ready": 1, "workers": 1}
    if ready < settings.workers:
        msg = f"{ready} of {settings.workers} gateway workers reach Triton"
        raise GatewayError(503, "unavailable", msg, retry_after=2)
    return {"status": "ready", "workers_ready": ready, "workers": settings.workers}


@router.get("/metrics", summary="Prometheus metrics")
async def prometheus():
    body, ctype = metrics.render()
    return Response(body, media_type=ctype)
