"""GET /v1/models, /healthz, /readyz and /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from yolov9.serve.gateway import metrics
from yolov9.serve.gateway.backend import BackendError, TritonPool
from yolov9.serve.gateway.dependencies import get_pool
from yolov9.serve.gateway.errors import GatewayError
from yolov9.serve.gateway.settings import Settings, get_settings

router = APIRouter()


@router.get("/v1/models", summary="The served model, its classes and its Triton configuration")
async def models(pool: TritonPool = Depends(get_pool), settings: Settings = Depends(get_settings)):
    try:
        cfg = await pool.model_info()
        names = await pool.class_names()
    except BackendError as e:
        raise GatewayError.from_backend(e) from None
    return {
        "models": [
            {
                "name": settings.model,
                "classes": names,
                "backend": cfg.get("backend") or cfg.get("platform"),
                "max_batch_size": cfg.get("max_batch_size"),
                "endpoints": settings.endpoints,
            }
        ]
    }


@router.get("/healthz", summary="Liveness: the gateway process answers")
async def healthz():
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: a Triton endpoint is reachable and the model is ready")
async def readyz(pool: TritonPool = Depends(get_pool)):
    if await pool.ready():
        return {"status": "ready"}
    raise GatewayError(503, "unavailable", "Triton unreachable or model not ready", retry_after=2)


@router.get("/metrics", summary="Prometheus metrics")
async def prometheus():
    body, ctype = metrics.render()
    return Response(body, media_type=ctype)
