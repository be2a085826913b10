import pytest
import torch
import torchvision

from yolov9.core import postprocess
from yolov9.core.boxes import scale_boxes_back, xywh2xyxy
from yolov9.core.postprocess import HOST_NMS_MAX, batched_nms, nms_flat, per_image


def _reference(pred, conf, iou, max_det):
    """Plain per-image NMS: best class per anchor, threshold, torchvision batched_nms over classes."""
    out = []
    for p, c_thr, m in zip(pred, conf, max_det):
        scores, cls = p[4:].max(0)
        keep = scores > c_thr
        boxes, scores, cls = xywh2xyxy(p[:4, keep].T), scores[keep], cls[keep]
        k = torchvision.ops.batched_nms(boxes, scores, cls, iou)[:m]
        out.append(torch.cat((boxes[k], scores[k, None], cls[k, None].float()), 1))
    return out


def test_batched_nms_equals_per_image_nms():
    g = torch.Generator().manual_seed(0)
    b, nc, a = 6, 5, 400
    xy = torch.rand(b, 2, a, generator=g) * 300
    wh = torch.rand(b, 2, a, generator=g) * 60 + 4
    pred = torch.cat((xy, wh, torch.rand(b, nc, a, generator=g)), 1)
    conf, max_det = [0.5, 0.9, 0.2, 0.99, 0.7, 1.0], [100, 7, 30, 100, 1, 5]
    got = per_image(nms_flat(pred, conf, 0.5, max_det))
    want = _reference(pred, conf, 0.5, max_det)
    assert [len(d) for d in got] == [len(d) for d in want] and len(got[-1]) == 0 and len(got[4]) == 1
    for d, w in zip(got, want):
        torch.testing.assert_close(d, w)


@pytest.mark.parametrize("max_det", [300, 3, [2], 0])
def test_one_image_gives_what_the_batch_path_gives_it(max_det):
    """A batch of one takes a shorter way (light load); it must return what the same image gets in a batch."""
    g = torch.Generator().manual_seed(1)
    xy = torch.rand(1, 2, 500, generator=g) * 300
    pred = torch.cat((xy, torch.rand(1, 2, 500, generator=g) * 60 + 4, torch.rand(1, 4, 500, generator=g)), 1)
    per = max_det if isinstance(max_det, list) else [max_det]
    alone = nms_flat(pred, 0.6, 0.5, max_det)
    batched = nms_flat(torch.cat((pred, torch.zeros_like(pred))), 0.6, 0.5, per + [5])  # the 2nd has no candidates
    uncapped = len(_reference(pred, [0.6], 0.5, [10**6])[0])
    assert uncapped > 3 and alone[3] == [min(per[0], uncapped)] == batched[3][:1] and batched[3][1] == 0
    for got, want in zip(alone[:3], batched[:3]):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "n, groups, chunk", [(800, 40, None), (3000, 1, None), (3000, 600, None), (20000, 2560, None), (500, 20, 60)]
)
def test_chunked_nms_keeps_what_torchvision_keeps_in_decreasing_score(n, groups, chunk):
    """Past a chunk's size the groups are sorted out once and suppressed a chunk of whole groups at a time (a group
    larger than a chunk alone); it must keep what torchvision keeps, in decreasing score.
    Integer boxes: offsets then round alike on both sides, as they do for pixel-grid boxes."""
    g = torch.Generator().manual_seed(n + groups)
    xy = (torch.rand(n, 2, generator=g) * 600).round()
    boxes = torch.cat((xy, xy + (torch.rand(n, 2, generator=g) * 120).round() + 2), 1)
    scores = (torch.rand(n, generator=g) * 50).round() / 50  # many equal scores
    key = torch.randint(0, groups, (n,), generator=g)
    want = torchvision.ops.batched_nms(boxes, scores, key, 0.6)
    got = batched_nms(boxes, scores, key, 0.6, chunk=chunk)
    assert len(want) < n and torch.equal(got.sort().values, want.sort().values)
    assert (scores[got].diff() <= 0).all()


def test_scale_boxes_back_per_box_equals_per_image():
    boxes = torch.tensor([[10.0, 20, 300, 400], [-5, 0, 700, 630], [50, 60, 70, 80]])
    metas = [(0.5, (0.0, 80.0), (480, 640)), (1.0, (12.0, 0.0), (600, 500)), (0.5, (0.0, 80.0), (480, 640))]
    one_by_one = torch.stack([scale_boxes_back(bx, r, p, hw)[0] for bx, (r, p, hw) in zip(boxes[:, None], metas)])
    ratio, pad, hw = (torch.tensor([m[i] for m in metas]) for i in range(3))
    torch.testing.assert_close(scale_boxes_back(boxes, ratio, pad, hw), one_by_one)
    assert (one_by_one[1] == torch.tensor([0.0, 0, 500, 600])).all()  # clipped to the image


def _official_multi_label_nms(pred, conf, iou, max_det, max_nms=30000):
    """The official validator's NMS, from its definition: every class above conf is a candidate, the max_nms
    highest per image go to one class-offset NMS, at most max_det survive."""
    import torchvision

    out = []
    for x in pred:
        x = x.T
        box, cls = xywh2xyxy(x[:, :4]), x[:, 4:]
        i, j = (cls > conf).nonzero(as_tuple=False).T
        x = torch.cat((box[i], cls[i, j, None], j[:, None].float()), 1)
        x = x[x[:, 4].argsort(descending=True)[:max_nms]]
        keep = torchvision.ops.nms(x[:, :4] + x[:, 5:6] * 7680, x[:, 4], iou)[:max_det]
        out.append(x[keep])
    return out


@pytest.mark.parametrize("max_nms", [30000, 40])
def test_multi_label_nms_equals_the_official_definition(max_nms):
    g = torch.Generator().manual_seed(0)
    b, nc, a = 3, 5, 400
    xy = torch.rand(b, 2, a, generator=g) * 200
    wh = 10 + torch.rand(b, 2, a, generator=g) * 40
    scores = torch.rand(b, nc, a, generator=g) ** 3  # several classes above conf per box, many overlaps
    pred = torch.cat((xy, wh, scores), 1)
    got = per_image(nms_flat(pred, 0.3, 0.6, 50, max_nms=max_nms, multi_label=True))
    want = _official_multi_label_nms(pred, 0.3, 0.6, 50, max_nms)
    for gi, wi in zip(got, want):
        assert len(gi) == len(wi) and len(gi) > 10
        key = lambda t: t[torch.argsort(t[:, 4] * 1000 + t[:, 5], descending=True)]  # noqa: E731
        torch.testing.assert_close(key(gi), key(wi))
    if max_nms == 30000:  # uncapped, one label per box keeps fewer
        one, every = (per_image(nms_flat(pred, 0.3, 0.6, 1000, multi_label=m)) for m in (False, True))
        assert sum(map(len, one)) < sum(map(len, every))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the host NMS path is taken only for predictions on a GPU")
@pytest.mark.parametrize("conf", [0.97, 0.3])  # few candidates (NMS on the host), many (NMS stays on the GPU)
def test_nms_on_the_host_for_few_candidates_equals_the_gpu_path(conf, monkeypatch):
    g = torch.Generator().manual_seed(0)
    b, nc, a = 4, 5, 400
    xy = torch.rand(b, 2, a, generator=g) * 300
    wh = torch.rand(b, 2, a, generator=g) * 60 + 4
    pred = torch.cat((xy, wh, torch.rand(b, nc, a, generator=g)), 1).cuda()
    few = int((pred[:, 4:].amax(1) > conf).sum()) <= HOST_NMS_MAX
    default = nms_flat(pred, conf, 0.5, [100, 3, 100, 0])
    monkeypatch.setattr(postprocess, "HOST_NMS_MAX", -1)  # every candidate stays on the GPU
    on_gpu = nms_flat(pred, conf, 0.5, [100, 3, 100, 0])
    assert default[0].device.type == ("cpu" if few else "cuda") and on_gpu[0].device.type == "cuda"
    assert default[3] == on_gpu[3] and sum(default[3]) > 3
    for got, want in zip(default[:3], on_gpu[:3]):
        torch.testing.assert_close(got.cpu(), want.cpu(), check_dtype=False)


def _random_pred(b: int, nc: int, a: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(b, 2, a, generator=g) * 300
    wh = torch.rand(b, 2, a, generator=g) * 60 + 4
    return torch.cat((xy, wh, torch.rand(b, nc, a, generator=g)), 1)


def test_threshold_candidates_then_nms_equals_postprocess_flat():
    """The server's path (a fixed-size buffer of the anchors over each image's threshold, then NMS of those) gives
    postprocess_flat's detections: per-image thresholds, caps and class filters, and a padding image whose
    threshold nothing passes."""
    from yolov9.core.postprocess import postprocess_candidates, postprocess_flat, threshold_candidates
    from yolov9.core.preprocess import LetterboxMeta

    b, nc = 5, 6
    pred = _random_pred(b, nc, 300)
    conf, max_det = [0.9, 0.97, 0.8, 0.95, float("inf")], [100, 2, 50, 100, 100]
    classes = [None, [1, 4], None, [0], None]
    metas = [LetterboxMeta((480, 640), 0.5, (0.0, 80.0)), LetterboxMeta((600, 500), 1.0, (12.0, 0.0))] * 2
    metas.append(metas[0])
    over = int((pred[:, 4:].amax(1) > torch.tensor(conf)[:, None]).sum())
    packed = threshold_candidates(pred, torch.tensor(conf), over + 7)
    assert packed.shape == (over + 8, 7) and packed[-1].tolist() == [float(over)] * 7
    got = postprocess_candidates(packed[:over], metas, nc, 0.5, max_det, classes)
    want = postprocess_flat(pred, metas, conf, 0.5, max_det, classes)
    assert got[3] == want[3] and sum(want[3]) > 10 and want[3][1] == 2 and want[3][4] == 0
    for g_, w in zip(got[:3], want[:3]):
        torch.testing.assert_close(g_, w)


def test_threshold_candidates_counts_those_past_its_buffer():
    """A buffer smaller than the candidates keeps the first ones in (image, anchor) order and counts them all."""
    from yolov9.core.postprocess import threshold_candidates

    pred = _random_pred(3, 4, 200, seed=1)
    conf = torch.tensor([0.8, 0.5, 0.9])
    scores, cls = pred[:, 4:].max(1)
    img, anchor = (scores > conf[:, None]).nonzero(as_tuple=True)
    packed = threshold_candidates(pred, conf, 10)
    assert len(img) > 10 and packed[-1, 0] == len(img)
    assert packed[:10, 6].long().tolist() == img[:10].tolist()
    torch.testing.assert_close(packed[:10, 4], scores[img[:10], anchor[:10]])
    torch.testing.assert_close(packed[:10, :4], xywh2xyxy(pred[img[:10], :4, anchor[:10]]))
