"""The YOLOv9 detection loss: task-aligned assignment, BCE classification, CIoU box and DFL terms, for any
number of heads with their weights (GELAN: one head; YOLOv9: auxiliary 0.25 + main 1.0, as officially).

Vectorised over the batch, with no host synchronisation: targets arrive as one list of rows over the batch (with
all-zero padding rows where a captured step needs a fixed count), and branches that the official code takes on
data-dependent conditions are computed unconditionally with masks.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from yolov9.core.boxes import bbox2dist, bbox_ciou, dist2bbox, make_anchors, xywh2xyxy
from yolov9.core.modules import in_compiled_trace
from yolov9.train.config import LossGains

DUAL_HEAD_WEIGHTS = (0.25, 1.0)  # auxiliary, main


class TaskAlignedAssigner:
    """Top-k anchors per ground truth by score^alpha * CIoU^beta, among anchors whose centre lies in the box.

    The boxes come as one list of rows over the batch, each with its image, not padded per image: the metric is a
    (boxes, anchors) tensor per term, so its cost follows the batch's boxes rather than images times the most
    boxes of one image (a mosaic of crowded images pads every image to that count). Each image's rows keep their
    order, so ties go where the official per-image argmax sends them. Eagerly, the per-box terms go through in
    chunks of at most `max_elements` entries (same result, bounded memory)."""

    def __init__(
        self,
        nc: int,
        topk: int = 10,
        alpha: float = 0.5,
        beta: float = 6.0,
        eps: float = 1e-9,
        max_elements: int = 2**25,
    ):
        self.nc, self.topk, self.alpha, self.beta, self.eps = nc, topk, alpha, beta, eps
        self.max_elements = max_elements

    @torch.no_grad()
    def __call__(self, pd_scores, pd_bboxes, anchors, gt_img, gt_labels, gt_bboxes, mask_gt):
        """pd_scores (b, A, nc) sigmoid; pd_bboxes (b, A, 4) xyxy px; anchors (A, 2) px; per box row: gt_img (R,)
        its image, gt_labels (R, 1), gt_bboxes (R, 4) xyxy px, mask_gt (R, 1) (0 for padding rows). Returns target
        boxes, scores and the foreground mask, per image and anchor."""
        b, num_anchors = pd_scores.shape[:2]
        r = gt_bboxes.shape[0]
        if r == 0:
            return (
                torch.zeros_like(pd_bboxes),
                torch.zeros_like(pd_scores),
                torch.zeros(pd_scores.shape[:2], dtype=torch.bool, device=pd_scores.device),
            )
        labels = gt_labels.long().squeeze(-1)  # (R,)
        # compiled, the row count is symbolic and inductor fuses the terms: no chunks (they would guard on it)
        step = r if in_compiled_trace() else max(1, self.max_elements // num_anchors)
        if step >= r:
            align, overlaps, mask_pos = self._box_terms(
                pd_scores, pd_bboxes, anchors, gt_img, labels, gt_bboxes, mask_gt
            )
        else:
            align, overlaps, mask_pos = (pd_scores.new_empty(r, num_anchors) for _ in range(3))
            for i in range(0, r, step):
                rows = slice(i, i + step)
                part = self._box_terms(pd_scores, pd_bboxes, anchors, gt_img[rows], labels[rows], gt_bboxes[rows],
                                       mask_gt[rows])  # fmt: skip
                for o, t in zip((align, overlaps, mask_pos), part):
                    o[rows] = t
        return self._resolve(pd_scores, gt_img, labels, gt_bboxes, align, overlaps, mask_pos)

    def _box_terms(self, pd_scores, pd_bboxes, anchors, gt_img, labels, gt_bboxes, mask_gt):
        """Per box row and anchor: the alignment metric, the CIoU and the top-k candidates inside the box."""
        scores = pd_scores[gt_img, :, labels]  # each box's class score at every anchor of its image, (R, A)
        overlaps = bbox_ciou(gt_bboxes.unsqueeze(1), pd_bboxes[gt_img]).squeeze(-1).clamp(0)
        align = scores.pow(self.alpha) * overlaps.pow(self.beta)
        del scores
        # anchor centre strictly inside the box by eps on all four sides
        ax, ay = anchors[:, 0], anchors[:, 1]
        x1, y1, x2, y2 = (c.unsqueeze(-1) for c in gt_bboxes.unbind(-1))  # (R, 1)
        in_gts = ((ax - x1) > self.eps) & ((ay - y1) > self.eps) & ((x2 - ax) > self.eps) & ((y2 - ay) > self.eps)
        in_gts = in_gts.to(align.dtype)
        topk_idx = torch.topk(align * in_gts, self.topk, dim=-1).indices  # (R, k)
        topk_idx = torch.where(mask_gt.bool().expand(-1, self.topk), topk_idx, 0)
        in_topk = torch.zeros_like(align).scatter_add_(-1, topk_idx, torch.ones_like(topk_idx, dtype=align.dtype))
        in_topk = torch.where(in_topk > 1, 0, in_topk)
        return align, overlaps, in_topk * in_gts * mask_gt

    def _resolve(self, pd_scores, gt_img, labels, gt_bboxes, align, overlaps, mask_pos):
        """One box per foreground anchor, and the targets. Per-image reductions over rows scatter into (b, A); row
        numbers are floats there (exact below 2^24), as the values they are reduced beside."""
        b, num_anchors = pd_scores.shape[:2]
        r = gt_bboxes.shape[0]
        per_image = align.new_zeros(b, num_anchors)
        row = torch.arange(r, device=align.device, dtype=align.dtype).unsqueeze(-1)  # (R, 1)
        no_row = align.new_full((b, num_anchors), float(r))
        index = gt_img.unsqueeze(-1).expand(-1, num_anchors)

        # an anchor claimed by several boxes goes to its image's box of highest IoU (the first on a tie)
        fg = per_image.index_add(0, gt_img, mask_pos)
        best_iou = per_image.scatter_reduce(0, index, overlaps, "amax")  # IoUs are >= 0: zero is a neutral start
        first_best = torch.where(overlaps == best_iou[gt_img], row, float(r))
        best = no_row.scatter_reduce(0, index, first_best, "amin")
        mask_pos = torch.where(fg[gt_img] > 1, (best[gt_img] == row).to(mask_pos.dtype), mask_pos)
        fg = per_image.index_add(0, gt_img, mask_pos)

        # each anchor's box: its one claiming row, else (a background anchor, zero weight) the image's first row,
        # else a zero box, as the official argmax over zero-padded boxes gives
        claimed = no_row.scatter_reduce(0, index, torch.where(mask_pos > 0, row, float(r)), "amin")
        first = no_row[:, :1].scatter_reduce(0, gt_img.unsqueeze(-1), row, "amin")  # (b, 1)
        gt_idx = torch.where(fg > 0, claimed, first).long()  # (b, A), r where the image has no rows
        target_labels = F.pad(labels, (0, 1))[gt_idx]
        target_bboxes = F.pad(gt_bboxes, (0, 0, 0, 1))[gt_idx]

        align = align * mask_pos
        pos_align = align.amax(-1, keepdim=True)
        pos_overlaps = (overlaps * mask_pos).amax(-1, keepdim=True)
        norm = per_image.scatter_reduce(0, index, align * pos_overlaps / (pos_align + self.eps), "amax")
        # the normalised score at each foreground anchor's class (no (b, A, nc) one-hot of int64)
        target_scores = torch.zeros_like(pd_scores).scatter_(
            -1, target_labels.clamp(0).unsqueeze(-1), (norm * (fg > 0)).unsqueeze(-1)
        )
        return target_bboxes, target_scores, fg > 0


class DetectionLoss:
    """Sum over heads of weight * (box, cls, dfl) terms, times the gains; returns (loss * batch, items)."""

    def __init__(
        self,
        nc: int,
        strides: torch.Tensor,
        reg_max: int = 16,
        head_weights: tuple[float, ...] = (1.0,),
        gains: LossGains | None = None,
        assigner: TaskAlignedAssigner | None = None,
    ):
        self.nc, self.reg_max, self.head_weights = nc, reg_max, head_weights
        self.gains = gains or LossGains()  # the official hyp file's box, cls and dfl
        self.strides = strides
        self.assigner = assigner or TaskAlignedAssigner(nc)  # top-10, alpha 0.5, beta 6.0 as officially
        self._constants: dict[tuple, tuple[torch.Tensor, ...]] = {}

    def constants(self, feats0: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Anchors, anchor strides, the xyxy pixel scale of normalised boxes and the gains, made once per device
        and feature-map shapes: no step copies constants from the host (a CUDA graph could not capture that)."""
        device = feats0[0].device
        key = (device, *(tuple(f.shape[2:]) for f in feats0))
        if key not in self._constants:
            strides = self.strides.to(device)
            anchors, stride_t = make_anchors(feats0, strides, 0.5, torch.float32)
            h, w = (float(v * strides[0]) for v in feats0[0].shape[2:])
            scale = torch.tensor([w, h, w, h], device=device)
            g = self.gains
            self._constants[key] = (anchors, stride_t, scale, torch.tensor([g.box, g.cls, g.dfl], device=device))
        return self._constants[key]

    @classmethod
    def for_model(cls, model, gains: LossGains | None = None) -> DetectionLoss:
        head = model.head
        weights = (1.0,) if head.groups == 1 else DUAL_HEAD_WEIGHTS
        return cls(head.nc, head.stride, head.reg_max, weights, gains=gains)

    def settings(self) -> dict:
        """Plain values that rebuild this loss elsewhere (`from_settings`, in the process filling compile caches)."""
        return {"nc": self.nc, "strides": self.strides.tolist(), "reg_max": self.reg_max,
                "head_weights": list(self.head_weights), "gains": dataclasses.asdict(self.gains),
                "assigner": dict(vars(self.assigner))}  # fmt: skip

    @classmethod
    def from_settings(cls, s: dict) -> DetectionLoss:
        return cls(s["nc"], torch.tensor(s["strides"]), s["reg_max"], tuple(s["head_weights"]), LossGains(**s["gains"]),
                   TaskAlignedAssigner(**s["assigner"]))  # fmt: skip

    def __call__(self, preds, targets: torch.Tensor):
        """preds: the model's training output (list of level maps, or list of such lists per head).
        targets: rows (image, class, x, y, w, h) normalised; all-zero rows are padding (`pad_rows`)."""
        heads = self.heads(preds)
        return self.terms(heads, targets, *self.constants(heads[0]))

    @staticmethod
    def heads(preds) -> list:
        """The model's training output as a list of heads, each a list of level maps."""
        return preds if isinstance(preds[0], (list, tuple)) else [preds]

    def terms(self, heads: list, rows: torch.Tensor, anchors, stride_t, scale, gains):
        """The loss of target rows, given `constants`: tensors in, tensors out, no host synchronisation and no
        Python state touched, so torch.compile can take it as one graph (train/compiled.py)."""
        feats0 = heads[0]
        b = feats0[0].shape[0]
        device = feats0[0].device  # the loss runs in fp32 whatever the autocast dtype
        rows = rows.to(device=device, dtype=torch.float32)
        gt_img, gt_labels, gt_xywh = rows.split((1, 1, 4), 1)
        gt_bboxes = xywh2xyxy(gt_xywh * scale)
        mask_gt = gt_bboxes.sum(1, keepdim=True).gt(0).float()
        gt = (gt_img.squeeze(-1).long(), gt_labels, gt_bboxes, mask_gt)

        loss = torch.zeros(3, device=device)
        for w, feats in zip(self.head_weights, heads):
            loss = loss + w * self._head(feats, anchors, stride_t, gt)
        loss = loss * gains
        return loss.sum() * b, loss.detach()

    def _head(self, feats, anchors, stride_t, gt: tuple[torch.Tensor, ...]) -> torch.Tensor:
        b = feats[0].shape[0]
        no = self.nc + 4 * self.reg_max
        # (b, anchors, no): from channels-last maps the permutes are views and the concatenation copies whole rows
        # (concatenating (b, no, h*w) views of them instead is a strided copy several times slower)
        pred = torch.cat([f.permute(0, 2, 3, 1).reshape(b, -1, no) for f in feats], 1).float()
        pred_dist, pred_scores = (t.contiguous() for t in pred.split((4 * self.reg_max, self.nc), -1))
        proj = torch.arange(self.reg_max, device=pred_dist.device, dtype=pred_dist.dtype)
        pa = pred_dist.view(b, -1, 4, self.reg_max).softmax(3).matmul(proj)
        pred_bboxes = dist2bbox(pa, anchors, xywh=False)  # grid units

        target_bboxes, target_scores, fg = self.assigner(
            pred_scores.detach().sigmoid(),
            (pred_bboxes.detach() * stride_t).to(gt[2].dtype),
            anchors * stride_t,
            *gt,
        )
        target_bboxes = target_bboxes / stride_t
        norm = target_scores.sum().clamp(min=1)

        cls = (
            F.binary_cross_entropy_with_logits(pred_scores, target_scores.to(pred_scores.dtype), reduction="none").sum()
            / norm
        )
        weight = target_scores.sum(-1) * fg  # (b, A), zero off the foreground
        iou = bbox_ciou(pred_bboxes, target_bboxes).squeeze(-1)
        box = ((1.0 - iou) * weight).sum() / norm

        target_ltrb = bbox2dist(anchors, target_bboxes, self.reg_max - 1)  # (b, A, 4)
        left = target_ltrb.long().clamp(max=self.reg_max - 2)
        wl = left + 1 - target_ltrb
        logp = pred_dist.view(b, -1, 4, self.reg_max).float().log_softmax(-1)
        dfl = -(
            logp.gather(-1, left.unsqueeze(-1)).squeeze(-1) * wl
            + logp.gather(-1, (left + 1).unsqueeze(-1)).squeeze(-1) * (1 - wl)
        )
        dfl = (dfl.mean(-1) * weight).sum() / norm
        return torch.stack((box, cls, dfl))
