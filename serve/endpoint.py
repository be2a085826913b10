"""A running deployment as something to score: the dataset's images sent as a client sends them (their original
encoded bytes) to the gateway over HTTP or to Triton over gRPC, detections back in original-image pixels."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from yolov9.core.errors import Unavailable
from yolov9.core.image_io import image_file_hw


async def _detect_all(send, files: list[Path], in_flight: int) -> list[np.ndarray]:
    sem = asyncio.Semaphore(in_flight)

    async def one(f: Path) -> np.ndarray:
        async with sem:
            return await send(f.read_bytes())

    return await asyncio.gather(*(one(f) for f in files))


def detect_files(url: str, files: list[Path], conf: float, iou: float, max_det: int, in_flight: int = 8):
    """(n, 6) detections per file from a gateway (http://...) or a Triton gRPC endpoint (host:port)."""
    if url.startswith(("http://", "https://")):
        return asyncio.run(_via_gateway(url, files, conf, iou, max_det, in_flight))
    return asyncio.run(_via_triton(url, files, conf, iou, max_det, in_flight))


async def _via_gateway(url, files, conf, iou, max_det, in_flight):
    import httpx

    params = {"conf": conf, "iou": iou, "max_det": max_det}
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=60) as client:

        async def send(data: bytes) -> np.ndarray:
            r = await client.post("/v1/detect", params=params, content=data, headers={"Content-Type": "image/jpeg"})
            if r.status_code != 200:
                raise Unavailable(f"{url}: HTTP {r.status_code}: {r.text[:200]}")
            rows = [d["box"] + [d["score"], d["class_id"]] for d in r.json()["detections"]]
            return np.array(rows, np.float64).reshape(-1, 6)

        return await _detect_all(send, files, in_flight)


async def _via_triton(url, files, conf, iou, max_det, in_flight):
    from yolov9.serve.gateway.backend import BackendError, TritonPool

    pool = TritonPool([url], "yolov9")
    try:
        await pool.start()

        async def send(data: bytes) -> np.ndarray:
            try:
                return (await pool.detect(data, conf, iou, max_det, None))[0].astype(np.float64)
            except BackendError as e:
                raise Unavailable(f"{url}: {e}") from None

        return await _detect_all(send, files, in_flight)
    finally:
        await pool.close()


def original_sizes(files: list[Path]) -> list[tuple[int, int]]:
    return [image_file_hw(f) for f in files]
