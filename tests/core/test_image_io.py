"""The image header read before decoding: JPEG frame sizes from the segment walk agree with PIL, and whatever the
walk cannot judge goes to PIL."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from yolov9.core.image_io import MAX_PIXELS, ImageError, _jpeg_hw, image_size
from yolov9.core.paths import PACKAGE_ROOT

SAMPLES = sorted((PACKAGE_ROOT / "core" / "assets" / "images").glob("*.jpg"))


def _variants() -> list[bytes]:
    """The sample files, and each saved again progressive with an EXIF block and as grayscale."""
    out = []
    for path in SAMPLES:
        out.append(path.read_bytes())
        im = Image.open(path)
        exif = Image.Exif()
        exif[0x010F] = "maker"
        for kwargs, mode in (({"progressive": True, "exif": exif}, "RGB"), ({}, "L")):
            buf = io.BytesIO()
            im.convert(mode).save(buf, "JPEG", **kwargs)
            out.append(buf.getvalue())
    return out


def _sof(data: bytes) -> int:
    """Offset of the first frame header (the walk's own job, done here the slow way: the first SOFn marker)."""
    return min(i for m in (b"\xff\xc0", b"\xff\xc2") if (i := data.find(m, 2)) > 0)


def test_jpeg_frame_size_equals_pil():
    variants = _variants()
    assert len(variants) == 3 * len(SAMPLES) >= 9
    for data in variants:
        w, h = Image.open(io.BytesIO(data)).size
        assert _jpeg_hw(data) == (h, w) == image_size(data)


def test_jpeg_declaring_too_many_pixels_is_refused_from_its_header():
    data = bytearray(SAMPLES[0].read_bytes())
    i = _sof(data)
    data[i + 5 : i + 9] = (10_000).to_bytes(2, "big") * 2  # 10,000 x 10,000 declared
    assert 10_000**2 > MAX_PIXELS
    with pytest.raises(ImageError, match="over the limit"):
        image_size(bytes(data))


@pytest.mark.parametrize("cut", ["before_frame", "zero_height", "not_jpeg"])
def test_what_the_walk_cannot_judge_goes_to_pil(cut):
    data = SAMPLES[0].read_bytes()
    if cut == "before_frame":  # truncated inside the header: PIL's error
        data = data[: _sof(data)]
    elif cut == "zero_height":  # a height left to a DNL marker: PIL reads it as it can
        i = _sof(data)
        data = data[: i + 5] + b"\x00\x00" + data[i + 7 :]
    else:
        data = b"GIF89a" + data[2:]
    assert _jpeg_hw(data) is None
    with pytest.raises(ImageError):
        image_size(data)
