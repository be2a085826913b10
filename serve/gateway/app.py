"""The FastAPI inference gateway in front of Triton: settings from YOLOV9_* variables (serve/gateway/settings.py),
routes in serve/gateway/routers/, shared concerns as dependencies, one error body for every failure."""

from __future__ import annotations

import gc
import os
import secrets
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI

from yolov9.serve.gateway import errors, metrics
from yolov9.serve.gateway.backend import TritonPool
from yolov9.serve.gateway.routers import admin, detect, service
from yolov9.serve.gateway.schemas import ErrorBody
from yolov9.serve.gateway.settings import Settings, get_settings


class ObserveMiddleware:
    """Request count and latency per /v1 endpoint, as plain ASGI (Starlette's BaseHTTPMiddleware costs a task
    and a stream per request). A path that is no route counts as "other": a client probing made-up paths must not
    add a series per path."""

    def __init__(self, app, paths: frozenset[str]):
        self.app, self.paths = app, paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        endpoint = scope["path"] if scope["path"] in self.paths else "other"
        t0, status = time.perf_counter(), [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            metrics.child(metrics.REQUESTS, endpoint, str(status[0])).inc()
            metrics.child(metrics.LATENCY, endpoint).observe(time.perf_counter() - t0)


class ApiKeyMiddleware:
    """With an API key set, the protected paths need it in X-API-Key; checked before routing, so a caller without it
    learns nothing of the API (not even which parameters are wrong), and the hot path solves no dependency for it."""

    def __init__(self, app, key: str | None, prefixes: tuple[str, ...]):
        self.app, self.key, self.prefixes = app, key.encode() if key else None, prefixes

    async def __call__(self, scope, receive, send):
        if self.key and scope["type"] == "http" and scope["path"].startswith(self.prefixes):
            given = next((v for k, v in scope["headers"] if k == b"x-api-key"), b"")
            if not secrets.compare_digest(given, self.key):
                e = errors.GatewayError(401, "unauthorized", "missing or wrong X-API-Key header")
                return await errors.error_response(e)(scope, receive, send)
        return await self.app(scope, receive, send)


def _start_profile():
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()  # this thread from now on: the event loop and every request it runs
    return profiler


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.pool = TritonPool(
            settings.endpoints, settings.model, settings.timeout_s, settings.health_interval_s, settings.metrics_urls
        )
        await app.state.pool.start(settings.startup_wait_s)
        app.state.in_flight = 0
        # what exists now lives as long as the worker: keep it out of the collector's full passes, which would
        # otherwise walk all of it while every request in flight on this worker waits
        gc.collect()
        gc.freeze()
        profiler = _start_profile() if settings.profile else None
        yield
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{settings.profile}.{os.getpid()}.prof")
        await app.state.pool.close()

    app = FastAPI(
        title="yolov9-trt gateway",
        version="0.1.0",
        lifespan=lifespan,
        description="Object detection over HTTP: images in, boxes out. Backed by Triton Inference Server.",
        responses={code: {"model": ErrorBody} for code in (400, 401, 403, 408, 409, 413, 415, 422, 503, 504)},
    )
    app.state.settings = settings
    errors.install(app)
    routers = (detect.router, service.router, admin.router)
    for router in routers:
        app.include_router(router)
    app.add_middleware(ApiKeyMiddleware, key=settings.api_key, prefixes=(detect.router.prefix, admin.router.prefix))
    paths = frozenset(r.path for router in routers for r in router.routes if r.path.startswith("/v1/"))
    app.add_middleware(ObserveMiddleware, paths=paths)  # added last: outermost, so it counts the 401s too
    return app


app = create_app  # uvicorn --factory serve.gateway.app:app
