"""Triton python model after a tensorrt_plan engine: raw predictions + META -> fixed-size detections in
original-image pixels (core/postprocess.py, the one NMS of the project)."""

import json

import caller_path  # noqa: F401 (first: the caller's PYTHONPATH on sys.path)
import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils

from yolov9.core.detection_defaults import CONF, IOU
from yolov9.core.postprocess import per_image, postprocess_flat
from yolov9.core.preprocess import LetterboxMeta


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg["parameters"].items()}
        self.max_det = int(params["max_det"])
        # the ensemble's API carries no thresholds: they are set in this model's config
        self.conf, self.iou = float(params.get("conf", CONF)), float(params.get("iou", IOU))

    def execute(self, requests):
        out = []
        for req in requests:
            raw = torch.from_dlpack(pb_utils.get_input_tensor_by_name(req, "output0").to_dlpack()).float()
            meta = torch.from_dlpack(pb_utils.get_input_tensor_by_name(req, "META").to_dlpack()).reshape(-1).tolist()
            m = LetterboxMeta((int(meta[0]), int(meta[1])), meta[2], (meta[3], meta[4]))
            det = per_image(postprocess_flat(raw, [m], self.conf, self.iou, self.max_det))[0]
            dets = torch.zeros(1, self.max_det, 6, device=raw.device)
            dets[0, : len(det)] = det
            n = torch.tensor([[len(det)]], dtype=torch.int32, device=raw.device)
            out.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor.from_dlpack("DETECTIONS", torch.utils.dlpack.to_dlpack(dets)),
                        pb_utils.Tensor.from_dlpack("NUM_DETS", torch.utils.dlpack.to_dlpack(n)),
                    ]
                )
            )
        return out
