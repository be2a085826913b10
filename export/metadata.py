"""What an exported engine is, in one place: the sidecar JSON beside every engine file (`model.onnx.json`,
`model.pt2.json`, `model.plan.json`), and for ONNX the same fields inside the file's metadata_props.

Readers take the image size, class names and input dtype from here, so `val`, `predict` and `serve` run an
engine at the size it was exported for; an engine without its metadata is an error that names the file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from yolov9.core.errors import BadInput


class MetadataError(BadInput):
    """An engine whose metadata is missing or unreadable; the message names the file."""


@dataclass
class EngineMeta:
    names: list[str]
    img_size: int
    strides: list[float]
    dtype: str = "float32"  # of the input tensor: float32 or float16
    end2end: bool = False  # NMS inside the graph (fixed-size detection outputs instead of raw predictions)
    device: str = "cpu"  # what the engine was built for
    source: str = ""  # the weights it was exported from
    data: str | None = None  # the dataset those weights were trained on, when known
    nms: dict | None = None  # end2end: conf, iou, max_det baked into the graph
    extra: dict = field(default_factory=dict)  # format-specific facts (compiler options, TensorRT build, ...)

    @staticmethod
    def path_for(engine: str | Path) -> Path:
        engine = Path(engine)
        return engine.with_name(engine.name + ".json")

    def write(self, engine: str | Path) -> Path:
        out = self.path_for(engine)
        out.write_text(json.dumps(asdict(self), indent=1))
        return out

    @classmethod
    def from_dict(cls, d: dict, where: str | Path) -> EngineMeta:
        known = {f.name for f in fields(cls)}
        try:
            meta = cls(**{k: v for k, v in d.items() if k in known})
        except TypeError as e:
            raise MetadataError(f"{where}: incomplete engine metadata ({e})") from None
        if not isinstance(meta.end2end, bool) or not isinstance(meta.img_size, int):
            raise MetadataError(f"{where}: malformed engine metadata (end2end must be a bool, img_size an int)")
        return meta

    @classmethod
    def read(cls, engine: str | Path) -> EngineMeta:
        p = cls.path_for(engine)
        if not p.is_file():
            raise MetadataError(
                f"{engine}: its metadata file {p.name} is missing (it holds the class names and image size); "
                f"keep it beside the engine or export again with `yolov9 export`"
            )
        try:
            return cls.from_dict(json.loads(p.read_text()), p)
        except json.JSONDecodeError as e:
            raise MetadataError(f"{p}: not JSON ({e})") from None

    def to_props(self) -> dict[str, str]:
        """The fields as ONNX metadata_props (strings: JSON-encoded values)."""
        return {k: json.dumps(v) for k, v in asdict(self).items()}

    @classmethod
    def from_props(cls, props: dict[str, str], where: str | Path) -> EngineMeta:
        if "names" not in props or "img_size" not in props:
            raise MetadataError(
                f"{where}: no yolov9-trt metadata (names, img_size) in the ONNX file; export it with "
                f"`yolov9 export onnx`"
            )
        try:
            return cls.from_dict({k: json.loads(v) for k, v in props.items()}, where)
        except json.JSONDecodeError as e:
            raise MetadataError(f"{where}: malformed metadata ({e})") from None
