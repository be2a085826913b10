"""`yolov9 predict`: any engine on image files, folders (of images or video frames) and video files; one JSON line
per image or frame, annotated copies, YOLO label files and crops in a numbered run folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from yolov9.core.detection_defaults import Thresholds
from yolov9.core.draw import draw_detections
from yolov9.core.errors import BadInput, MissingInput
from yolov9.core.image_io import ImageError
from yolov9.core.paths import SAMPLE_IMAGES
from yolov9.core.predict import Detections, predict_images
from yolov9.export.config import VIDEO_SUFFIXES, PredictConfig
from yolov9.export.engine import engine_spec, load_engine

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def run_dir(project: str, name: str, exist_ok: bool) -> Path:
    """project/name, or the first free project/name2, name3, ... (as Ultralytics numbers its runs)."""
    base = Path(project) / name
    path, k = base, 2
    while path.exists() and not exist_ok:
        path, k = Path(f"{base}{k}"), k + 1
    return path


def media(sources: list[str]) -> list[Path]:
    """Image and video files, folders expanded in name order (their images and videos by suffix); a file named
    itself is kept whatever its suffix (the decoder says whether it is an image), a folder without any is an error."""
    out = []
    for s in sources or [str(SAMPLE_IMAGES)]:
        p = Path(s)
        if not p.exists():
            raise MissingInput(f"{p}: no such file or folder")
        if not p.is_dir():
            out.append(p)
            continue
        found = [f for f in sorted(p.iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES + VIDEO_SUFFIXES]
        if not found:
            raise BadInput(f"{p}: no images or videos in this folder ({', '.join(IMAGE_SUFFIXES + VIDEO_SUFFIXES)})")
        out += found
    return out


class Outputs:
    """What a run writes beside the JSON lines: annotated images, labels/*.txt and crops/<class>/*.jpg."""

    def __init__(self, cfg: PredictConfig, out: Path | None):
        self.cfg, self.out = cfg, out

    def image(self, det: Detections, stem: str) -> np.ndarray:
        rgb = det.image.permute(1, 2, 0).numpy()
        if self.cfg.save_txt:
            self._labels(det, stem)
        if self.cfg.save_crop:
            self._crops(det, rgb, stem)
        return np.asarray(draw_detections(rgb, det.to_json()))

    def _labels(self, det: Detections, stem: str) -> None:
        h, w = det.shape
        d = self.out / "labels"
        d.mkdir(parents=True, exist_ok=True)
        rows = []
        for (x1, y1, x2, y2), s, c in zip(det.boxes.tolist(), det.scores.tolist(), det.classes.tolist()):
            row = f"{c} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} {(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}"
            rows.append(row + (f" {s:.5f}" if self.cfg.save_conf else ""))
        (d / f"{stem}.txt").write_text("".join(r + "\n" for r in rows))

    def _crops(self, det: Detections, rgb: np.ndarray, stem: str) -> None:
        from PIL import Image

        for k, ((x1, y1, x2, y2), label) in enumerate(zip(det.boxes.round().int().tolist(), det.labels)):
            if x2 > x1 and y2 > y1:
                d = self.out / "crops" / label
                d.mkdir(parents=True, exist_ok=True)
                Image.fromarray(rgb[y1:y2, x1:x2]).save(d / f"{stem}_{k}.jpg", quality=95)


def _line(source: str, det: Detections | None = None, error: str | None = None, frame: int | None = None) -> str:
    row = {"image": source} if frame is None else {"video": source, "frame": frame}
    row.update({"error": error} if error else {"detections": det.to_json()})
    return json.dumps(row)


def _video(path: Path, predict, outputs: Outputs) -> None:
    import cv2

    cap = cv2.VideoCapture(str(path))
    if not cap.isOpened():
        print(_line(str(path), error="cannot open this video (not a video OpenCV can read)"))
        return
    writer, k = None, 0
    while True:
        ok, bgr = cap.read()
        if not ok:
            break
        (det,) = predict(np.ascontiguousarray(bgr[:, :, ::-1]))
        print(_line(str(path), det, frame=k))
        if outputs.out is not None:
            drawn = outputs.image(det, f"{path.stem}_{k}")
            if writer is None:
                fps = cap.get(cv2.CAP_PROP_FPS) or 25.0
                size = (drawn.shape[1], drawn.shape[0])
                writer = cv2.VideoWriter(
                    str(outputs.out / f"{path.stem}.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), fps, size
                )
            writer.write(np.ascontiguousarray(drawn[:, :, ::-1]))
        k += 1
    cap.release()
    if writer is not None:
        writer.release()


def run_predict(cfg: PredictConfig) -> Path | None:
    """Prints one JSON line per image (or video frame); returns the run folder (None with --no-save and no
    labels or crops)."""
    from PIL import Image

    files = media(cfg.source)  # a missing or empty source is said before the engine loads
    engine = load_engine(engine_spec(cfg.engine, cfg.weights), device=cfg.device, img_size=cfg.img)
    print(f"engine {engine.kind} at {engine.img_size} px", file=sys.stderr)
    saving = cfg.save or cfg.save_txt or cfg.save_crop
    out = run_dir(cfg.project, cfg.name, cfg.exist_ok) if saving else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    outputs = Outputs(cfg, out)
    nms = Thresholds(cfg.conf, cfg.iou, cfg.max_det)

    def predict(src):
        return predict_images(engine, src, engine.img_size, engine.names, nms, cfg.classes)

    with torch.inference_mode():
        for f in files:
            if f.suffix.lower() in VIDEO_SUFFIXES:
                _video(f, predict, outputs)
                continue
            try:
                (det,) = predict(f)
            except (ImageError, OSError) as e:
                print(_line(str(f), error=str(e)))
                continue
            print(_line(str(f), det))
            if out is not None:
                drawn = outputs.image(det, f.stem)
                if cfg.save:
                    Image.fromarray(drawn).save(out / f.name)
    if out is not None:
        print(f"results in {out}", file=sys.stderr)
    return out
