"""The gateway's settings, from YOLOV9_* environment variables (set by `yolov9 serve gateway`)."""

from __future__ import annotations

from functools import lru_cache

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="YOLOV9_")

    triton_urls: str = "127.0.0.1:8001"  # comma list of Triton gRPC endpoints
    # their metrics URLs in the same order (default: each gRPC port + 1, Triton's own layout 8001 -> 8002)
    triton_metrics_urls: str = ""
    model: str = "yolov9"
    max_upload_bytes: int = 20 * 2**20
    max_in_flight: int = 512  # per worker; beyond it requests get 503 + Retry-After
    timeout_s: float = 30.0
    api_key: str | None = None  # when set, clients send it as the X-API-Key header
    max_batch_images: int = 64
    startup_wait_s: float = 10.0  # a starting worker waits this long for Triton before it accepts connections
    health_interval_s: float = 0.5  # how often each Triton endpoint is checked (and its served version read)
    workers: int = 1  # the gateway's worker processes: /readyz is 200 only when every one of them reaches Triton
    # a worker whose last successful check is older than this counts as not ready (hung, stopped); generous, as a
    # worker saturated by requests checks late
    ready_max_age_s: float = 5.0
    header_timeout_s: float = 10.0  # a request's headers must arrive within this, else 408 and the connection closes
    body_timeout_s: float = 60.0  # and its body within this after them
    max_connections: int = 1024  # open connections per worker; beyond it new ones get 503 and are closed
    repo: str | None = None  # the model repository, for deploy/rollback through the admin endpoints
    profile: str | None = None  # bench gateway --profile: each worker writes its cProfile to <profile>.<pid>.prof

    @property
    def endpoints(self) -> list[str]:
        return [u for u in self.triton_urls.split(",") if u]

    @property
    def metrics_urls(self) -> list[str]:
        given = [u for u in self.triton_metrics_urls.split(",") if u]
        if given:
            return given
        return [f"http://{host}:{int(port) + 1}/metrics" for host, port in (u.rsplit(":", 1) for u in self.endpoints)]


@lru_cache
def get_settings() -> Settings:
    return Settings()
