"""The HTTP contract: request parameters and response bodies (the OpenAPI page documents them)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from yolov9.core.detection_defaults import CONF, IOU, MAX_DET, MAX_DET_LIMIT


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


class ImageFailure(BaseModel):
    """A batch's image that could not be answered for a fault of its own (the other images are answered)."""

    error: str = Field(description="bad_image, too_large or unsupported_type")
    detail: str = Field(description="which file (files[k] and its name) and what is wrong with it")
    status: int = Field(description="the HTTP status this image alone would have been answered with")


class BatchResponse(BaseModel):
    results: list[DetectResponse | ImageFailure] = Field(
        description="one per uploaded file, in upload order: its detections, or why that file has none"
    )


class ErrorBody(BaseModel):
    error: str = Field(description="bad_image, too_large, unsupported_type, invalid_parameters, unauthorized, ...")
    detail: str


class DetectQuery(BaseModel):
    """The detect endpoints' query parameters, validated as one model (one pydantic call per request, not one per
    parameter); bad values are answered with 422."""

    conf: float = Field(CONF, ge=0.0, le=1.0, description="score threshold")
    iou: float = Field(IOU, gt=0.0, le=1.0, description="NMS IoU threshold")
    max_det: int = Field(MAX_DET, ge=1, le=MAX_DET_LIMIT, description="maximum detections per image")
    classes: str | None = Field(None, pattern=r"^\d+(,\d+)*$", description="comma-separated class ids to keep")

    def class_ids(self) -> list[int] | None:
        return [int(c) for c in self.classes.split(",")] if self.classes else None
