"""The gateway's settings, from YOLOV9_* environment variables (set by `yolov9 serve gateway`)."""

from __future__ import annotations

from functools import lru_cache

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="YOLOV9_")

    triton_urls: str = "127.0.0.1:8001"  # comma list of Triton gRPC endpoints
    model: str = "yolov9"
    max_upload_bytes: int = 20 * 2**20
    max_in_flight: int = 512  # per worker; beyond it requests get 503 + Retry-After
    timeout_s: float = 30.0
    api_key: str | None = None  # when set, clients send it as the X-API-Key header
    max_batch_images: int = 64
    health_interval_s: float = 0.5  # how often each Triton endpoint is checked (and its served version read)
    header_timeout_s: float = 10.0  # a request's headers must arrive within this, else 408 and the connection closes
    body_timeout_s: float = 60.0  # and its body within this after them
    max_connections: int = 1024  # open connections per worker; beyond it new ones get 503 and are closed
    repo: str | None = None  # the model repository, for deploy/rollback through the admin endpoints

    @property
    def endpoints(self) -> list[str]:
        return [u for u in self.triton_urls.split(",") if u]


@lru_cache
def get_settings() -> Settings:
    return Settings()
