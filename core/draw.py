"""Drawing detections on an image (predict's saved images and the gateway's /v1/detect/annotated)."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw

_PALETTE = [
    (255, 56, 56),
    (255, 157, 151),
    (255, 112, 31),
    (255, 178, 29),
    (207, 210, 49),
    (72, 249, 10),
    (146, 204, 23),
    (61, 219, 134),
    (26, 147, 52),
    (0, 212, 187),
    (44, 153, 168),
    (0, 194, 255),
    (52, 69, 147),
    (100, 115, 255),
    (0, 24, 236),
    (132, 56, 255),
    (82, 0, 133),
    (203, 56, 255),
]


def score_text(score: float) -> str:
    """A score to two significant digits (0.87, 0.0012), as drawn on images."""
    return f"{score:.2g}"


def draw_detections(image: Image.Image | np.ndarray, dets: list[dict], label: bool = True) -> Image.Image:
    """dets: the JSON form (box, class_id, class_name, and score unless they are labels)."""
    img = Image.fromarray(image) if isinstance(image, np.ndarray) else image.convert("RGB")
    d = ImageDraw.Draw(img)
    for det in dets:
        color = _PALETTE[det["class_id"] % len(_PALETTE)]
        x1, y1, x2, y2 = det["box"]
        d.rectangle((x1, y1, x2, y2), outline=color, width=max(2, round(min(img.size) / 300)))
        if not label:
            continue
        label_text = det["class_name"] + (f" {score_text(det['score'])}" if det.get("score") is not None else "")
        tw = d.textlength(label_text)
        d.rectangle((x1, max(0, y1 - 12), x1 + tw + 4, max(12, y1)), fill=color)
        d.text((x1 + 2, max(0, y1 - 12)), label_text, fill=(255, 255, 255))
    return img


def encode_jpeg(img: Image.Image, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()
