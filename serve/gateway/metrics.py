"""Prometheus metrics of the gateway (multi-process aware when uvicorn runs several workers)."""

from __future__ import annotations

import os
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REQUESTS = Counter("gateway_requests_total", "HTTP requests by endpoint and status", ["endpoint", "status"])
LATENCY = Histogram(
    "gateway_request_seconds",
    "request latency",
    ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
IN_FLIGHT = Gauge("gateway_in_flight", "requests being served", multiprocess_mode="livesum")
ERRORS = Counter("gateway_errors_total", "errors by kind", ["kind"])
ENDPOINT_UP = Gauge(
    "gateway_endpoint_up", "1 while a Triton endpoint serves the model", ["endpoint"], multiprocess_mode="livemax"
)
ENDPOINT_REQUESTS = Counter("gateway_endpoint_requests_total", "inference requests answered by endpoint", ["endpoint"])
ENDPOINT_ERRORS = Counter("gateway_endpoint_errors_total", "inference requests failed by endpoint", ["endpoint"])
ENDPOINT_LATENCY = Histogram(
    "gateway_endpoint_seconds",
    "inference latency by endpoint",
    ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RETRIES = Counter("gateway_retries_total", "requests retried on another endpoint after a failure")
# one sample per live worker (multi-process): /readyz counts the workers whose value is recent
WORKER_READY_AT = Gauge(
    "gateway_worker_ready_at_seconds",
    "when this worker's last health check found a Triton endpoint serving the model (unix time)",
    multiprocess_mode="liveall",
)
BATCH_SIZE = Histogram("gateway_batch_images", "images per /v1/detect/batch request", buckets=(1, 2, 4, 8, 16, 32, 64))


_children: dict[tuple, object] = {}


def child(metric, *labels: str):
    """metric.labels(*labels), kept: prometheus-client's labels() takes a lock and builds the key on every call, and
    the hot path asks for four per request. The label values must come from a bounded set (configured endpoints,
    known routes, statuses): every distinct one is kept here and exported as a series."""
    key = (metric, labels)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*labels)
    return found


def render() -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST


def workers_ready(max_age_s: float) -> int | None:
    """How many workers found the model served within the last max_age_s (a hung or stopped worker's value goes
    stale, a dead one's is removed by the supervisor); None in a one-process gateway, which speaks for itself."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    now = time.time()
    return sum(
        1
        for family in registry.collect()
        if family.name == "gateway_worker_ready_at_seconds"
        for sample in family.samples
        if 0 <= now - sample.value <= max_age_s
    )
