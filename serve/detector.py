"""What Triton's python backend runs: decode encoded images (core/decode.py: the GPU's JPEG engines where it has
them), letterbox on the device, one engine call for the whole dynamic batch, NMS on the device, fixed-size
detections per image. Importable and tested on its own; serve/triton/model.py only adapts Triton's request
objects to it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from yolov9.core.decode import Encoded, decode_images, pick_decoder
from yolov9.core.detection_defaults import CONF, IOU, MAX_DET
from yolov9.core.postprocess import postprocess_flat
from yolov9.core.preprocess import ImageError, prepare_batch, to_input
from yolov9.export.cuda_graph import CudaGraphEngine
from yolov9.export.engine import load_engine


@dataclass
class Request:
    data: Encoded
    conf: float = CONF
    iou: float = IOU
    max_det: int = MAX_DET
    classes: list[int] | None = None


def cpu_threads_per_instance(model_config: dict) -> int:
    """This Triton instance's share of the process's threads (torch's count: the cores, or OMP_NUM_THREADS): CPU
    instances of one model run at once, and each taking every core makes their threads thrash."""
    groups = model_config.get("instance_group", [])
    count = sum(int(g.get("count", 1)) for g in groups if g.get("kind") == "KIND_CPU")
    return max(1, torch.get_num_threads() // max(count, 1))


def graph_buckets(max_batch: int, step: int = 8) -> list[int]:
    """Batch sizes that get a CUDA graph: 1, 2, 4, then every multiple of `step`, and max_batch itself, so a
    batch is padded by fewer than `step` images (powers of two alone would run a batch of 33 as 64)."""
    sizes = {b for b in (1, 2, 4) if b <= max_batch} | set(range(step, max_batch + 1, step)) | {max_batch}
    return sorted(sizes)


class Detector:
    """cuda_graphs: on a GPU, pad each batch up to the next bucket size and replay one captured CUDA graph per
    bucket (small Triton batches are launch-bound otherwise); captured in warmup()."""

    def __init__(
        self,
        engine_path: str,
        device: str = "auto",
        max_det: int = MAX_DET,
        img_size: int | None = None,
        cuda_graphs: bool = True,
        max_batch: int = 64,
        decoder: str = "auto",
    ):
        self.engine = load_engine(engine_path, device=device, img_size=img_size)
        self.device = self.engine.device
        self.max_det = max_det
        self.names = self.engine.names
        self.decoder = pick_decoder(self.device, decoder)  # core/decode.py: nvImageCodec, nvJPEG or the CPU
        self.buckets = graph_buckets(max_batch) if cuda_graphs and self.device.type == "cuda" else []
        self.run = CudaGraphEngine(self.engine) if self.buckets else self.engine

    def warmup(self) -> None:
        size = self.engine.img_size
        for b in self.buckets or [1]:
            try:
                self.run(torch.zeros(b, 3, size, size, device=self.device, dtype=self.engine.dtype))
            except RuntimeError as e:  # an engine that cannot be captured still serves, kernel by kernel
                print(f"CUDA graph capture failed ({str(e).splitlines()[0]}); running without graphs", flush=True)
                self.buckets, self.run = [], self.engine
                self.engine(torch.zeros(1, 3, size, size, device=self.device, dtype=self.engine.dtype))
                return

    def _infer(self, x: torch.Tensor) -> torch.Tensor:
        n = len(x)
        bucket = next((b for b in self.buckets if b >= n), None)
        if bucket is None:  # no graphs, or a batch larger than the biggest bucket
            return self.engine(x)
        if bucket > n:
            x = torch.cat((x, x.new_zeros((bucket - n, *x.shape[1:]))))
        return self.run(x)[:n]

    def predict(self, requests: list[Request], lap: _Stopwatch | None = None):
        """Decode, letterbox and run the engine on the decodable images: (per request its decoded image or its
        ImageError, indices of the decodable requests, their letterbox metas, raw predictions (B, 4 + nc, A))."""
        lap = lap or _Stopwatch(None, self.device)
        results: list = decode_images([r.data for r in requests], self.device, self.decoder)
        lap("decode")
        ok = [k for k, img in enumerate(results) if not isinstance(img, ImageError)]
        if not ok:
            return results, ok, [], None
        batch, metas = prepare_batch([results[k] for k in ok], self.engine.img_size, self.device)
        x = to_input(batch, self.engine.dtype)
        lap("letterbox")
        pred = self._infer(x)
        lap("engine")
        return results, ok, metas, pred

    def __call__(
        self, requests: list[Request], timings: dict[str, float] | None = None
    ) -> list[tuple[torch.Tensor, int] | ImageError]:
        """Per request: ((max_det, 6) x1, y1, x2, y2, score, class in original pixels, zero-padded, on the CPU;
        count) or the error that request's image raised (other requests in the batch still succeed).

        The whole batch goes through one batched decode, one engine call and one NMS per distinct IoU value.
        `timings` accumulates seconds per stage (decode, letterbox, engine, nms)."""
        lap = _Stopwatch(timings, self.device)
        try:
            return self._detect(requests, lap)
        finally:
            lap.close()

    def _detect(self, requests: list[Request], lap: _Stopwatch) -> list[tuple[torch.Tensor, int] | ImageError]:
        results, ok, metas, pred = self.predict(requests, lap)
        if not ok:
            return results
        out = torch.zeros(len(ok), self.max_det, 6)  # responses leave through host memory
        counts = [0] * len(ok)
        for iou in sorted({requests[k].iou for k in ok}):
            rows = [j for j, k in enumerate(ok) if requests[k].iou == iou]
            reqs = [requests[ok[j]] for j in rows]
            det, owner, rank, n = postprocess_flat(
                pred[rows] if len(rows) < len(ok) else pred,
                [metas[j] for j in rows],
                [r.conf for r in reqs],
                iou,
                [min(r.max_det, self.max_det) for r in reqs],
                [r.classes for r in reqs],
            )
            # the detections with their image and rank in one copy to the host (none when NMS ran there), then
            # every detection to (its image's row, its rank within the image) in one scatter
            flat = torch.cat((det.float(), owner[:, None].float(), rank[:, None].float()), 1).cpu()
            out[torch.tensor(rows)[flat[:, 6].long()], flat[:, 7].long()] = flat[:, :6]
            for j, c in zip(rows, n):
                counts[j] = c
        for j, k in enumerate(ok):
            results[k] = (out[j], counts[j])
        lap("nms")
        return results


class _Stopwatch:
    """Adds each stage's seconds to timings[stage]; does nothing without timings. On a GPU the laps are CUDA events
    on the current stream, read at close(), after the call's copy to the host has waited for them: the split costs
    no synchronisation, so a served batch can be timed as it runs."""

    def __init__(self, timings: dict[str, float] | None, device: torch.device):
        self.timings, self.device = timings, device
        self.cuda = device.type == "cuda" and timings is not None
        self.laps: list[tuple[str, torch.cuda.Event]] = []
        self.t = time.perf_counter()
        if self.cuda:
            self.start = self._event()

    def _event(self) -> torch.cuda.Event:
        e = torch.cuda.Event(enable_timing=True)
        e.record(torch.cuda.current_stream(self.device))
        return e

    def __call__(self, stage: str) -> None:
        if self.timings is None:
            return
        if self.cuda:
            self.laps.append((stage, self._event()))
            return
        now = time.perf_counter()
        self.timings[stage] = self.timings.get(stage, 0.0) + now - self.t
        self.t = now

    def close(self) -> None:
        if not self.laps:
            return
        self.laps[-1][1].synchronize()
        prev = self.start
        for stage, e in self.laps:
            self.timings[stage] = self.timings.get(stage, 0.0) + prev.elapsed_time(e) / 1000
            prev = e
        self.laps = []
