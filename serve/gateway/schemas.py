"""The HTTP contract: request parameters and response bodies (the OpenAPI page documents them)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field


class Detection(BaseModel):
    box: list[float] = Field(description="x1, y1, x2, y2 in original-image pixels")
    score: float
    class_id: int
    class_name: str


class DetectResponse(BaseModel):
    detections: list[Detection]
    width: int
    height: int
    latency_ms: float
    model: str = Field(description="the served model's name")
    version: int = Field(description="the model version that answered")


class BatchResponse(BaseModel):
    results: list[DetectResponse]


class ErrorBody(BaseModel):
    error: str = Field(description="bad_image, too_large, unsupported_type, invalid_parameters, unauthorized, ...")
    detail: str


@dataclass
class DetectParams:
    conf: float
    iou: float
    max_det: int
    classes: list[int] | None
