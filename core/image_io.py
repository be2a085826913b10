"""The torch-free part of image I/O: header checks before decoding, the one-line image error, and detections as
JSON. The gateway imports only this: a worker that also loads torch holds hundreds of thousands of Python objects,
and each full garbage-collection pass over them stalls every request in flight on that worker."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Protocol

from PIL import Image

from yolov9.core.errors import BadInput

MAX_PIXELS = 64_000_000  # decompression-bomb guard: refuse images that declare more pixels than this


class ImageError(BadInput):
    """An input that is not a decodable image; the message is one line."""


# JPEG's start-of-frame markers (baseline, extended, progressive, lossless, arithmetic): the frame size follows them
_JPEG_SOF = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))


def _jpeg_hw(data: bytes) -> tuple[int, int] | None:
    """(height, width) from a JPEG's frame header, walking the segments by their lengths; None for anything else
    (not a JPEG, no frame header before the scan, a height left to a DNL marker), which PIL then judges. PIL parses
    every table on the way (a tenth of a millisecond per request in the gateway); this reads only the lengths."""
    if data[:2] != b"\xff\xd8":
        return None
    i, n = 2, len(data)
    while i + 9 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker in _JPEG_SOF:
            h, w = int.from_bytes(data[i + 5 : i + 7], "big"), int.from_bytes(data[i + 7 : i + 9], "big")
            return (h, w) if h and w else None
        elif marker in (0xDA, 0xD9):  # the scan or the end before any frame header
            return None
        elif marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
        else:
            i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return None


def image_size(data: bytes) -> tuple[int, int]:
    """(height, width) from the header alone, so oversized images are refused before decoding."""
    h, w = _jpeg_hw(data) or _pil_hw(data)
    if w * h > MAX_PIXELS:
        raise ImageError(f"image declares {w}x{h} pixels, over the limit of {MAX_PIXELS:,}")
    return h, w


def _pil_hw(data: bytes) -> tuple[int, int]:
    """(height, width) as PIL reads the header, for the formats the decoders take."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            fmt = im.format
    except Image.DecompressionBombError:
        raise ImageError(f"image declares more pixels than the limit of {MAX_PIXELS:,}") from None
    except Exception:
        raise ImageError("not a decodable image (unknown format or corrupt header)") from None
    if fmt not in ("JPEG", "PNG", "BMP", "WEBP", "GIF", "TIFF", "MPO"):
        raise ImageError(f"unsupported image format {fmt}")
    return h, w


def image_file_hw(path: str | Path) -> tuple[int, int]:
    """(height, width) of an image file from its header, reading no more of the file than that needs."""
    try:
        with Image.open(path) as im:
            w, h = im.size
    except Exception:
        raise ImageError(f"{path}: not a decodable image") from None
    return h, w


class _Rows(Protocol):  # a torch tensor or a numpy array
    def tolist(self) -> list: ...


def detections_to_json(det: _Rows, names: list[str]) -> list[dict]:
    """(n, 6) rows x1, y1, x2, y2, score, class -> JSON-ready dicts."""
    out = []
    for x1, y1, x2, y2, s, c in det.tolist():
        c = int(c)
        out.append(
            {
                "box": [round(x1, 2), round(y1, 2), round(x2, 2), round(y2, 2)],
                "score": round(s, 5),
                "class_id": c,
                "class_name": names[c] if c < len(names) else str(c),
            }
        )
    return out
