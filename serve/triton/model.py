"""Triton python-backend model for YOLOv9 detection: thin by design, the work lives in serve/detector.py.

Tensors cross the stub through DLPack only: the stub of the nvidia-pytriton server was built against numpy 1.x and
mis-shapes `pb_utils.Tensor(name, ndarray)` outputs under numpy 2."""

import json
import os
import time

import caller_path  # noqa: F401 (first: the caller's PYTHONPATH on sys.path)
import torch
import triton_python_backend_utils as pb_utils
from torch.utils.dlpack import to_dlpack

from yolov9.core.detection_defaults import CONF, IOU, MAX_DET
from yolov9.core.image_io import ImageError
from yolov9.serve.config import DECODER, GPU_WAIT
from yolov9.serve.detector import Detector, Request, threads_per_instance


def _inputs(request) -> dict[str, torch.Tensor]:
    """The request's inputs by name, in one pass (the optional parameters are absent when at their defaults)."""
    return {t.name(): torch.from_dlpack(t.to_dlpack()) for t in request.inputs()}


class _Metrics:
    """This instance's series on Triton's metrics endpoint:
    - yolov9_decoder_info{model, decoder}: instances decoding with that decoder;
    - yolov9_decoded_images_total{model, decoder}: images taken in, counted per batch;
    - yolov9_execute_seconds_total{model, stage}: seconds per stage of the batches (requests: reading the inputs;
      decode, letterbox, engine, nms: the detector's, timed on the GPU's stream; responses: building the outputs),
      and yolov9_execute_images_total{model}: the images those seconds cover. Each update is a message to the
      server (about 25 us), so these two are added up here and sent together at most every FLUSH_S: divided one by
      the other they give each stage's time per image.
    Inert where the server has metrics off."""

    FLUSH_S = 0.5
    STAGES = ("requests", "decode", "letterbox", "engine", "nms", "responses")

    def __init__(self, model: str, decoder: str):
        self.pending, self.images, self.last = dict.fromkeys(self.STAGES, 0.0), 0, time.monotonic()
        try:
            families = [
                pb_utils.MetricFamily(name=name, description=text, kind=getattr(pb_utils.MetricFamily, kind))
                for name, text, kind in (
                    ("yolov9_decoder_info", "model instances decoding with this JPEG decoder", "GAUGE"),
                    ("yolov9_decoded_images_total", "images decoded, by decoder", "COUNTER"),
                    ("yolov9_execute_seconds_total", "seconds the instances spent per stage of a batch", "COUNTER"),
                    ("yolov9_execute_images_total", "images in the batches yolov9_execute_seconds covers", "COUNTER"),
                )
            ]
        except Exception:
            self.families = None
            return
        self.families = families  # kept: a metric whose family is gone cannot be updated
        info, decoded, stages, images = families
        info.Metric(labels={"model": model, "decoder": decoder}).increment(1)
        self.decoded = decoded.Metric(labels={"model": model, "decoder": decoder})
        self.stages = {k: stages.Metric(labels={"model": model, "stage": k}) for k in self.STAGES}
        self.timed = images.Metric(labels={"model": model})

    def add(self, images: int, seconds: dict[str, float]) -> None:
        if self.families is None:
            return
        self.decoded.increment(images)
        self.images += images
        for k, v in seconds.items():
            self.pending[k] += v
        if time.monotonic() - self.last >= self.FLUSH_S:
            self.flush()

    def flush(self) -> None:
        if self.families is None or not self.images:
            return
        for k, v in self.pending.items():
            self.stages[k].increment(v)
        self.timed.increment(self.images)
        self.pending, self.images, self.last = dict.fromkeys(self.STAGES, 0.0), 0, time.monotonic()


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        kind = args.get("model_instance_kind", "CPU")
        device = f"cuda:{args['model_instance_device_id']}" if kind == "GPU" else "cpu"
        torch.set_num_threads(threads_per_instance(cfg))
        engine = params["engine"]
        local = os.path.join(args["model_repository"], args["model_version"], engine)
        if os.path.exists(local):  # a file copied into the version folder; else an absolute path or a zoo name
            engine = local
        self.detector = Detector(
            engine,
            device=device,
            max_det=int(params.get("max_det", MAX_DET)),
            img_size=int(params.get("img_size", 640)),
            cuda_graphs=params.get("cuda_graphs", "1") == "1",
            max_batch=max(int(cfg.get("max_batch_size", 0)), 1),
            decoder=params.get("decoder", DECODER),
        )
        self.detector.gpu_wait = params.get("gpu_wait", GPU_WAIT)
        self.detector.warmup()
        threads = f", {torch.get_num_threads()} CPU threads"
        name, decoder = f"{args['model_name']} instance {args['model_instance_name']}", self.detector.decoder.name
        print(f"{name}: decoder {decoder}{threads}")
        self.metrics = _Metrics(args["model_name"], decoder)

    def execute(self, requests):
        t0 = time.perf_counter()
        parsed = []
        for req in requests:
            # the encoded bytes are read where the request holds them: no copy before the decoder's
            given = _inputs(req)
            data = memoryview(given["IMAGE"].reshape(-1).numpy())
            conf, iou, max_det, classes = (given.get(k) for k in ("CONF", "IOU", "MAX_DET", "CLASSES"))
            parsed.append(
                Request(
                    data,
                    conf=float(conf.reshape(-1)[0]) if conf is not None else CONF,
                    iou=float(iou.reshape(-1)[0]) if iou is not None else IOU,
                    max_det=int(max_det.reshape(-1)[0]) if max_det is not None else MAX_DET,
                    classes=classes.reshape(-1).tolist() if classes is not None and classes.numel() else None,
                )
            )
        seconds = {"requests": time.perf_counter() - t0}
        results = self.detector(parsed, timings=seconds)
        t1 = time.perf_counter()
        responses = []
        for res in results:
            if isinstance(res, Exception):
                what = "bad image" if isinstance(res, ImageError) else "invalid parameters"
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{what}: {res}")))
                continue
            dets, n = res
            out = [
                pb_utils.Tensor.from_dlpack("DETECTIONS", to_dlpack(dets[None].contiguous())),
                pb_utils.Tensor.from_dlpack("NUM_DETS", to_dlpack(torch.tensor([[n]], dtype=torch.int32))),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        seconds["responses"] = time.perf_counter() - t1
        self.metrics.add(len(parsed), seconds)
        return responses

    def finalize(self):
        # no last flush: a metric update waits for the server's answer, which a server unloading this model never
        # gives (the stub would hang, and the unload with it); the timings of the last FLUSH_S are lost
        self.detector = self.metrics = None
