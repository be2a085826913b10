"""Triton python-backend model for YOLOv9 detection: thin by design, the work lives in serve/detector.py.

Tensors cross the stub through DLPack only: the stub of the nvidia-pytriton server was built against numpy 1.x and
mis-shapes `pb_utils.Tensor(name, ndarray)` outputs under numpy 2."""

import json
import os

import caller_path  # noqa: F401 (first: the caller's PYTHONPATH on sys.path)
import torch
import triton_python_backend_utils as pb_utils
from torch.utils.dlpack import to_dlpack

from yolov9.core.detection_defaults import CONF, IOU, MAX_DET
from yolov9.serve.detector import Detector, Request, cpu_threads_per_instance


def _input(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else torch.from_dlpack(t.to_dlpack())


def _decoder_metrics(model: str, decoder: str):
    """The decoder this instance uses, on Triton's metrics endpoint: yolov9_decoder_info{model, decoder} (instances
    using it) and yolov9_decoded_images_total{model, decoder}. (families, counter), kept together: a metric whose
    family is gone cannot be updated. None where the server has metrics off."""
    try:
        info = pb_utils.MetricFamily(
            name="yolov9_decoder_info",
            description="model instances decoding with this JPEG decoder",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        count = pb_utils.MetricFamily(
            name="yolov9_decoded_images_total",
            description="images decoded, by decoder",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        labels = {"model": model, "decoder": decoder}
        instances = info.Metric(labels=labels)
        instances.increment(1)
        return (info, count, instances), count.Metric(labels=labels)
    except Exception:
        return None, None


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        kind = args.get("model_instance_kind", "CPU")
        device = f"cuda:{args['model_instance_device_id']}" if kind == "GPU" else "cpu"
        if kind == "CPU":
            torch.set_num_threads(cpu_threads_per_instance(cfg))
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
            decoder=params.get("decoder", "auto"),
        )
        self.detector.warmup()
        threads = f", {torch.get_num_threads()} CPU threads" if kind == "CPU" else ""
        name, decoder = f"{args['model_name']} instance {args['model_instance_name']}", self.detector.decoder.name
        print(f"{name}: decoder {decoder}{threads}")
        self._metric_families, self.decoded = _decoder_metrics(args["model_name"], decoder)

    def execute(self, requests):
        parsed = []
        for req in requests:
            data = _input(req, "IMAGE").reshape(-1).cpu().numpy().tobytes()
            conf, iou = _input(req, "CONF"), _input(req, "IOU")
            max_det, classes = _input(req, "MAX_DET"), _input(req, "CLASSES")
            parsed.append(
                Request(
                    data,
                    conf=float(conf.reshape(-1)[0]) if conf is not None else CONF,
                    iou=float(iou.reshape(-1)[0]) if iou is not None else IOU,
                    max_det=int(max_det.reshape(-1)[0]) if max_det is not None else MAX_DET,
                    classes=classes.reshape(-1).tolist() if classes is not None and classes.numel() else None,
                )
            )
        if self.decoded is not None:
            self.decoded.increment(len(parsed))
        responses = []
        for res in self.detector(parsed):
            if isinstance(res, Exception):
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"bad image: {res}")))
                continue
            dets, n = res
            out = [
                pb_utils.Tensor.from_dlpack("DETECTIONS", to_dlpack(dets[None].contiguous())),
                pb_utils.Tensor.from_dlpack("NUM_DETS", to_dlpack(torch.tensor([[n]], dtype=torch.int32))),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses

    def finalize(self):
        self.detector = self.decoded = self._metric_families = None
