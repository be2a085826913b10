"""What Triton's python backend runs: decode encoded images (core/decode.py: the GPU's JPEG engines where it has
them), letterbox on the device, then one step for the whole dynamic batch (scaling to [0, 1], the engine and the
anchors over each image's threshold gathered into a buffer of fixed size, replayed as one CUDA graph per batch
bucket), one copy of those candidates to the host and NMS there (on the GPU for many), fixed-size detections per
image. Importable and tested on its own; serve/triton/model.py only adapts Triton's request objects to it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

from yolov9.core.decode import Encoded, decode_images, pick_decoder
from yolov9.core.detection_defaults import CONF, IOU, MAX_DET, threshold_problem
from yolov9.core.device import to_host
from yolov9.core.errors import BadInput
from yolov9.core.postprocess import main_head, postprocess_candidates, postprocess_flat, threshold_candidates
from yolov9.core.preprocess import prepare_batch, to_input
from yolov9.export.cuda_graph import CudaGraphEngine
from yolov9.export.engine import Engine, load_engine
from yolov9.serve.config import DECODER, GPU_WAIT

# Room per image in the step's candidate buffer. A trained detector puts a few to a few dozen anchors of a photo
# over the serving threshold; a batch with more (a low threshold, as `val --url` sends) runs NMS of them all from
# the step's raw predictions instead.
CANDIDATES_PER_IMAGE = 128


@dataclass
class Request:
    data: Encoded
    conf: float = CONF
    iou: float = IOU
    max_det: int = MAX_DET
    classes: list[int] | None = None


def thread_share(processes: int) -> int:
    """One of `processes` processes' share of torch's threads (the cores, or OMP_NUM_THREADS), at least one."""
    return max(1, torch.get_num_threads() // max(processes, 1))


def threads_per_instance(model_config: dict) -> int:
    """This Triton instance's share of the process's threads (torch's count: the cores, or OMP_NUM_THREADS). A
    model's instances are processes that run at once, and each taking every core makes their threads thrash: the
    CPU instances' whole work, and a GPU instance's host-side NMS and response copies. A GPU group's count is per
    GPU it names, or per visible GPU when it names none, as Triton reads it."""
    count = 0
    for g in model_config.get("instance_group", []):
        n = int(g.get("count", 1))
        if g.get("kind") == "KIND_GPU":
            n *= len(g.get("gpus") or []) or max(torch.cuda.device_count(), 1)
        count += n
    return thread_share(count)


def graph_buckets(max_batch: int, step: int = 8) -> list[int]:
    """Batch sizes that get a CUDA graph: 1, 2, 4, then every multiple of `step`, and max_batch itself, so a
    batch is padded by fewer than `step` images (powers of two alone would run a batch of 33 as 64)."""
    sizes = {b for b in (1, 2, 4) if b <= max_batch} | set(range(step, max_batch + 1, step)) | {max_batch}
    return sorted(sizes)


class DetectionStep:
    """A letterboxed uint8 batch (B, 3, S, S) and each image's threshold (B,) on the engine's device -> the
    candidates over them (threshold_candidates, room for `per_image` per image) and the raw predictions: the work
    between letterbox and NMS as one call with fixed shapes, which CudaGraphEngine captures whole."""

    dtype = torch.uint8

    def __init__(self, engine: Engine, per_image: int = CANDIDATES_PER_IMAGE):
        self.engine, self.per_image = engine, per_image
        self.kind, self.names, self.img_size, self.device = engine.kind, engine.names, engine.img_size, engine.device

    def __call__(self, batch: torch.Tensor, conf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pred = main_head(self.engine(to_input(batch, self.engine.dtype)))
        return threshold_candidates(pred, conf, self.per_image * len(batch)), pred


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
        decoder: str = DECODER,
    ):
        self.engine = load_engine(engine_path, device=device, img_size=img_size)
        self.gpu_wait = GPU_WAIT  # how the host waits for the GPU's results (core/device.to_host): spin or block
        self.device = self.engine.device
        self.max_det = max_det
        self.names = self.engine.names
        self.decoder = pick_decoder(self.device, decoder)  # core/decode.py: nvImageCodec, nvJPEG or the CPU
        # on a GPU, the batch's letterbox in one kernel; False: the per-size reference path (core/preprocess.py)
        self.letterbox_kernel = True
        self.buckets = graph_buckets(max_batch) if cuda_graphs and self.device.type == "cuda" else []
        self.step = DetectionStep(self.engine)
        self.gpu = self.device if self.device.type == "cuda" else None  # where NMS of many candidates runs
        # the step's outputs are read before the next batch replays it (one batch at a time per Detector)
        self.run = CudaGraphEngine(self.step, clone=False) if self.buckets else self.step

    def warmup(self) -> None:
        size = self.engine.img_size
        # the letterbox kernel compiles at its first call: here, not in the first request
        blank = torch.zeros(3, 2, 3, dtype=torch.uint8)
        prepare_batch([blank, blank], size, self.device, kernel=self.letterbox_kernel)
        for b in self.buckets or [1]:
            batch = torch.zeros(b, 3, size, size, device=self.device, dtype=self.step.dtype)
            conf = torch.full((b,), CONF, device=self.device)
            try:
                self.run(batch, conf)
            except RuntimeError as e:  # an engine that cannot be captured still serves, kernel by kernel
                print(f"CUDA graph capture failed ({str(e).splitlines()[0]}); running without graphs", flush=True)
                self.buckets, self.run = [], self.step
                self.step(batch[:1], conf[:1])
                return

    def predict(self, requests: list[Request], lap: _Stopwatch | None = None) -> Predicted:
        """Decode, letterbox and run the step on the decodable images of the requests with valid parameters
        (padded up to their bucket with blank images that no threshold lets through)."""
        lap = lap or _Stopwatch(None, self.device)
        problems = [threshold_problem(r.conf, r.iou, r.max_det, r.classes) for r in requests]
        decoded = iter(decode_images([r.data for r, p in zip(requests, problems) if not p], self.device, self.decoder))
        results: list = [BadInput(p) if p else next(decoded) for p in problems]  # invalid requests are not decoded
        lap("decode")
        ok = [k for k, img in enumerate(results) if not isinstance(img, BadInput)]
        if not ok:
            return Predicted(results, ok, [], None, None)
        rows = next((b for b in self.buckets if b >= len(ok)), len(ok))
        batch, metas = prepare_batch(
            [results[k] for k in ok], self.engine.img_size, self.device, rows=rows, kernel=self.letterbox_kernel
        )
        conf = torch.tensor([requests[k].conf for k in ok] + [float("inf")] * (rows - len(ok)))
        lap("letterbox")
        cand, pred = self.run(batch, conf) if rows in self.buckets else self.step(batch, conf.to(self.device))
        lap("engine")
        return Predicted(results, ok, metas, cand, pred)

    def __call__(
        self, requests: list[Request], timings: dict[str, float] | None = None
    ) -> list[tuple[torch.Tensor, int] | BadInput]:
        """Per request: ((max_det, 6) x1, y1, x2, y2, score, class in original pixels, zero-padded, on the CPU;
        count), or the request's error: an ImageError for its image, a BadInput for its parameters (the other
        requests in the batch still succeed).

        The whole batch goes through one batched decode, one step (engine and candidates), one copy of the
        candidates to the host and one NMS per distinct IoU value. `timings` accumulates seconds per stage
        (decode, letterbox, engine, nms)."""
        lap = _Stopwatch(timings, self.device, blocking=self.gpu_wait == "block")
        try:
            return self._detect(requests, lap)
        finally:
            lap.close()

    def _detect(self, requests: list[Request], lap: _Stopwatch) -> list[tuple[torch.Tensor, int] | BadInput]:
        results, ok, metas, cand, pred = self.predict(requests, lap)
        if not ok:
            return results
        cand = to_host(cand, self.gpu_wait)  # the batch's one synchronisation before NMS
        total = int(cand[-1, 0])
        cand = cand[:total] if total < len(cand) else None  # None: the buffer could not hold them all
        out = torch.zeros(len(ok), self.max_det, 6)  # responses leave through host memory
        counts = [0] * len(ok)
        for iou in sorted({requests[k].iou for k in ok}):
            rows = [j for j, k in enumerate(ok) if requests[k].iou == iou]
            reqs = [requests[ok[j]] for j in rows]
            group = (
                [metas[j] for j in rows],
                iou,
                [min(r.max_det, self.max_det) for r in reqs],
                [r.classes for r in reqs],
            )
            if cand is not None:
                flat = postprocess_candidates(
                    _only_images(cand, rows, len(ok)), group[0], len(self.names), *group[1:], gpu=self.gpu
                )
            else:
                part = pred[rows] if len(rows) < len(pred) else pred
                flat = postprocess_flat(part, group[0], [r.conf for r in reqs], *group[1:])
            det, owner, rank, n = flat
            if det.device.type != "cpu":  # NMS ran on the GPU: the detections with their image and rank in one copy
                packed = to_host(torch.cat((det, owner[:, None].float(), rank[:, None].float()), 1), self.gpu_wait)
                det, owner, rank = packed[:, :6], packed[:, 6].long(), packed[:, 7].long()
            # every detection to (its image's row, its rank within the image) in one scatter
            out[owner if len(rows) == len(ok) else torch.tensor(rows)[owner], rank] = det
            for j, c in zip(rows, n):
                counts[j] = c
        for j, k in enumerate(ok):
            results[k] = (out[j], counts[j])
        lap("nms")
        return results


def _only_images(cand: torch.Tensor, rows: list[int], b: int) -> torch.Tensor:
    """The candidates of the batch's images `rows`, their image column renumbered 0.. in that order."""
    if len(rows) == b:
        return cand
    local = torch.full((b,), -1.0)
    local[rows] = torch.arange(len(rows), dtype=local.dtype)
    img = local[cand[:, 6].long()]
    cand = cand[img >= 0].clone()
    cand[:, 6] = img[img >= 0]
    return cand


class Predicted(NamedTuple):
    """Detector.predict's result: per request its decoded image or its error (BadInput), the indices of the decodable
    requests, their letterbox metas, the step's candidate buffer (threshold_candidates) and raw predictions
    (B, 4 + nc, A), both on the device and B padded up to the bucket (None, None without a decodable image)."""

    results: list
    ok: list[int]
    metas: list
    candidates: torch.Tensor | None
    pred: torch.Tensor | None


class _Stopwatch:
    """Adds each stage's seconds to timings[stage]; does nothing without timings. On a GPU the laps are CUDA events
    on the current stream, read at close(), after the call's copy to the host has waited for them: the split costs
    no synchronisation, so a served batch can be timed as it runs."""

    def __init__(self, timings: dict[str, float] | None, device: torch.device, blocking: bool = False):
        self.timings, self.device, self.blocking = timings, device, blocking
        self.cuda = device.type == "cuda" and timings is not None
        self.laps: list[tuple[str, torch.cuda.Event]] = []
        self.t = time.perf_counter()
        if self.cuda:
            self.start = self._event()

    def _event(self) -> torch.cuda.Event:
        e = torch.cuda.Event(enable_timing=True, blocking=self.blocking)
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
