"""ONNX export: the deployed (re-parameterized, fused) model with dynamic batch, in fp32 or fp16, as raw
predictions (official layout) or end-to-end with the standard ONNX NonMaxSuppression inside the graph.

Input `images`: float (B, 3, H, W), RGB, values in [0, 1], letterboxed with 114 padding (core/preprocess.py).
Raw output `output0`: (B, 4 + nc, anchors), xywh boxes in input pixels and sigmoid scores.
End-to-end outputs: `num_dets` (B, 1) int64, `det_boxes` (B, max_det, 4) xyxy, `det_scores` (B, max_det),
`det_classes` (B, max_det) int64; rows past num_dets are zero."""

from __future__ import annotations

from pathlib import Path

import onnx
import torch
import torchvision
from torch import nn

from yolov9.core.boxes import xywh2xyxy
from yolov9.core.checkpoint import weights_source
from yolov9.core.detection_defaults import Thresholds
from yolov9.core.errors import BadInput
from yolov9.core.model import DetectionModel
from yolov9.export.metadata import EngineMeta

OPSET = 17


class _NMS(torch.autograd.Function):
    """ONNX NonMaxSuppression when exported; torchvision's per-class NMS when run (only for tracing)."""

    @staticmethod
    def forward(ctx, boxes, scores, max_per_class, iou, score_thr):
        out = []
        for b in range(boxes.shape[0]):
            s, c = scores[b].max(0)
            keep = s > score_thr
            idx = keep.nonzero().squeeze(1)
            sel = torchvision.ops.batched_nms(boxes[b, idx], s[idx], c[idx], float(iou))
            idx = idx[sel][: int(max_per_class)]
            out.append(torch.stack((torch.full_like(idx, b), c[idx], idx), 1))
        return torch.cat(out) if out else torch.zeros(0, 3, dtype=torch.int64)

    @staticmethod
    def symbolic(g, boxes, scores, max_per_class, iou, score_thr):
        return g.op("NonMaxSuppression", boxes, scores, max_per_class, iou, score_thr, center_point_box_i=0)


class End2End(nn.Module):
    """Deployed model + best-class-per-anchor NMS per class + fixed-size outputs, matching
    core.postprocess.nms_flat."""

    def __init__(self, model: nn.Module, conf: float, iou: float, max_det: int):
        super().__init__()
        self.model, self.conf, self.iou, self.max_det = model, conf, iou, max_det

    def forward(self, x):
        pred = self.model(x)  # (B, 4 + nc, A)
        boxes = xywh2xyxy(pred[:, :4].transpose(1, 2)).float()  # (B, A, 4)
        cls_scores = pred[:, 4:].float()  # (B, nc, A)
        best, idx = cls_scores.max(1, keepdim=True)
        # exactly one class per anchor: a mask of scores equal to the best would keep every class of a tie, and the
        # anchor would come out of NMS once per tied class
        scores = torch.zeros_like(cls_scores).scatter(1, idx, best)
        sel = _NMS.apply(
            boxes, scores, torch.tensor([self.max_det]), torch.tensor([self.iou]), torch.tensor([self.conf])
        )
        b, c, i = sel[:, 0], sel[:, 1], sel[:, 2]
        sel_scores = scores[b, c, i]
        sel_boxes = boxes[b, i]
        bsz = x.shape[0]
        # dense (B, K + max_det) score matrix, padded so top-k of a constant k always exists
        own = b.unsqueeze(0) == torch.arange(bsz, device=x.device).unsqueeze(1)
        dense = torch.where(own, sel_scores.unsqueeze(0), torch.full_like(sel_scores, -1.0).unsqueeze(0))
        dense = torch.cat((dense, torch.full((bsz, self.max_det), -1.0, device=x.device)), 1)
        top_s, top_i = dense.topk(self.max_det, dim=1)
        pad_boxes = torch.cat((sel_boxes, torch.zeros(self.max_det, 4, device=x.device)), 0)
        pad_cls = torch.cat((c, torch.zeros(self.max_det, dtype=c.dtype, device=x.device)), 0)
        valid = top_s > 0
        det_boxes = pad_boxes[top_i] * valid.unsqueeze(-1)
        det_scores = top_s * valid
        det_classes = pad_cls[top_i] * valid
        return valid.sum(1, keepdim=True), det_boxes, det_scores, det_classes


def export_onnx(
    weights: str | Path | DetectionModel,
    out: str | Path,
    img: int = 640,
    half: bool = False,
    dynamic_hw: bool = False,
    nms: Thresholds | None = None,
    batch: int = 1,
) -> Path:
    """The deployed model as ONNX (opset 17, dynamic batch), checked; with `nms`, end-to-end: NMS inside the
    graph and fixed-size outputs."""
    out = Path(out)
    end2end = nms is not None
    src, source, data = weights_source(weights)
    names = src.names
    model = src.deploy()
    strides = model.stride.tolist()
    dtype = torch.float16 if half else torch.float32
    model = model.to(dtype)
    net = End2End(model, nms.conf, nms.iou, nms.max_det) if end2end else model
    x = torch.zeros(batch, 3, img, img, dtype=dtype)
    axes = {0: "batch", 2: "height", 3: "width"} if dynamic_hw else {0: "batch"}
    if end2end:
        outputs = ["num_dets", "det_boxes", "det_scores", "det_classes"]
        dyn = {"images": axes, **{o: {0: "batch"} for o in outputs}}
    else:
        outputs = ["output0"]
        dyn = {"images": axes, "output0": {0: "batch", 2: "anchors"} if dynamic_hw else {0: "batch"}}
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            net,
            (x,),
            str(out),
            input_names=["images"],
            output_names=outputs,
            opset_version=OPSET,
            dynamic_axes=dyn,
            dynamo=False,
            do_constant_folding=True,
        )
    meta = EngineMeta(
        names=list(names),
        img_size=img,
        strides=strides,
        dtype="float16" if half else "float32",
        end2end=end2end,
        source=source,
        data=data,
        nms={"conf": nms.conf, "iou": nms.iou, "max_det": nms.max_det} if end2end else None,
        extra={"input": "images: float (B,3,H,W) RGB in [0,1], letterboxed with 114", "outputs": outputs},
    )
    proto = onnx.load(str(out))
    for k, v in meta.to_props().items():
        proto.metadata_props.add(key=k, value=v)
    onnx.checker.check_model(proto)
    onnx.save(proto, str(out))
    meta.write(out)
    return out


class OnnxEngine:
    kind = "onnx"

    def __init__(self, path: str | Path, threads: int | None = None, allow_end2end: bool = False):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        # torch's thread count (the cores, OMP_NUM_THREADS, or a Triton instance's share) unless told otherwise
        opts.intra_op_num_threads = threads or torch.get_num_threads()
        try:
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's errors are long; the first line names the cause
            raise BadInput(f"{path}: ONNX Runtime cannot load it ({str(e).strip().splitlines()[0][:200]})") from None
        self.meta = EngineMeta.from_props(self.session.get_modelmeta().custom_metadata_map, path)
        if self.meta.end2end and not allow_end2end:
            raise BadInput(
                f"{path}: an end-to-end ONNX (NMS inside, fixed-size outputs) cannot be scored or post-processed "
                f"here; export without --end2end for val, predict and serve"
            )
        self.names, self.img_size, self.end2end = self.meta.names, self.meta.img_size, self.meta.end2end
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.dtype = torch.float16 if "float16" in inp.type else torch.float32
        self.device = torch.device("cpu")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.end2end:
            raise TypeError("this ONNX file has NMS inside (end-to-end); use it with run_end2end()")
        out = self.session.run(None, {self.input_name: x.detach().cpu().to(self.dtype).numpy()})
        return torch.from_numpy(out[0]).float()

    def run_end2end(self, x: torch.Tensor) -> list:
        return [torch.from_numpy(o) for o in self.session.run(None, {self.input_name: x.cpu().to(self.dtype).numpy()})]
