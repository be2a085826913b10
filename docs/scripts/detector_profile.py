"""Where one Triton instance's time goes for small batches: the serving Detector (decode, letterbox, engine, NMS and
the copy out) under torch.profiler, one table per batch size: the top operators by host time, and the host-device
synchronisations and copies counted; then the milliseconds per call with NMS on the host for few candidates (the
default, core.postprocess.HOST_NMS_MAX) and always on the GPU. For the light-load latency (a batch of 1 is what one
request in flight gives).
Usage, from the checkout: PYTHONPATH=. python docs/scripts/detector_profile.py ENGINE IMAGES_DIR OUT.txt [BATCHES]"""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from yolov9.core import postprocess
from yolov9.serve.detector import Detector, Request
from yolov9.serve.loadtest import load_images

SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize", "aten::item")


def profile_batch(det: Detector, blobs: list[bytes], batch: int, iters: int = 50) -> str:
    reqs = [Request(blobs[i % len(blobs)], conf=0.25) for i in range(batch)]
    for _ in range(10):  # capture this bucket's graph and warm the allocator outside the profile
        det(reqs)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if det.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(iters):
            det(reqs)
    events = prof.key_averages()
    counted = {e.key: e.count // iters for e in events if e.key in SYNCS}
    table = events.table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=60)
    return f"== batch {batch}: per call {counted}\n{table}\n{nms_where(det, reqs)}\n"


def nms_where(det: Detector, reqs: list[Request], iters: int = 200) -> str:
    """Milliseconds per call (median of iters) with NMS on the host for few candidates, and always on the GPU."""
    default, rows = postprocess.HOST_NMS_MAX, []
    for label, limit in (("host for few", default), ("always GPU", -1)):
        postprocess.HOST_NMS_MAX = limit
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            det(reqs)
            if det.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        rows.append(f"NMS {label}: {1e3 * sorted(times)[iters // 2]:.3f} ms per call")
    postprocess.HOST_NMS_MAX = default
    return "\n".join(rows)


def main() -> None:
    engine, images, out = sys.argv[1:4]
    batches = [int(b) for b in (sys.argv[4] if len(sys.argv) > 4 else "1,8").split(",")]
    det = Detector(engine, max_batch=max(batches))
    det.warmup()
    blobs = load_images(images)
    text = "".join(profile_batch(det, blobs, b) for b in batches)
    with open(out, "w") as f:
        f.write(f"engine {engine}, decoder {det.decoder.name}, device {det.device}\n{text}")
    print(text)


if __name__ == "__main__":
    main()
