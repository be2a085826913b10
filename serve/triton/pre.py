"""Triton python model before a tensorrt_plan engine: encoded bytes -> letterboxed fp16 images + META
(orig h, orig w, ratio, pad left, pad top). Same preprocessing as everywhere else (core/preprocess.py)."""

import json

import caller_path  # noqa: F401 (first: the caller's PYTHONPATH on sys.path)
import torch
import torch.utils.dlpack
import triton_python_backend_utils as pb_utils

from yolov9.core.decode import decode_image
from yolov9.core.preprocess import ImageError, letterbox
from yolov9.serve.detector import threads_per_instance


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        self.size = int(cfg["parameters"]["img_size"]["string_value"])
        self.device = f"cuda:{args['model_instance_device_id']}" if args.get("model_instance_kind") == "GPU" else "cpu"
        torch.set_num_threads(threads_per_instance(cfg))

    def execute(self, requests):
        out = []
        for req in requests:
            t = pb_utils.get_input_tensor_by_name(req, "IMAGE")
            data = torch.from_dlpack(t.to_dlpack()).reshape(-1).cpu().numpy().tobytes()
            try:
                img, m = letterbox(decode_image(data, self.device), self.size)
            except ImageError as e:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"bad image: {e}")))
                continue
            x = (img.half() / 255)[None].contiguous()
            meta = torch.tensor([[*m.orig_hw, m.ratio, *m.pad]], dtype=torch.float32, device=x.device)
            out.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor.from_dlpack("images", torch.utils.dlpack.to_dlpack(x)),
                        pb_utils.Tensor.from_dlpack("META", torch.utils.dlpack.to_dlpack(meta)),
                    ]
                )
            )
        return out
