#!/usr/bin/env bash
# Two H200s against one, in one call on the device kind nvidia-h200-x2 (issue "Two-GPU training measured"):
#   source .gpu/bootstrap.sh && OUT=$OUT bash docs/scripts/two_gpu_scaling.sh
# yolov9-s at 640, RAM cache, coco128 replicated x32 (4,096 images): `bench train` on 1 GPU and under torchrun on 2
# (batch 128 per GPU), then `yolov9 train` for 3 epochs as a user runs it on --device 0 (batch 128 and 256) and on
# --device 0,1 (global batch 256), each with the peak host RAM (PSS) of its process tree. Writes
# $OUT/scaling_2gpu.json ("gpus": 2, "scaling", RAM ratio, loss items side by side) and the raw JSON of each step.
# DEVICES, REPEAT, STEPS and EPOCHS override the defaults (a dry run on one GPU: DEVICES=0 REPEAT=2 STEPS=5 EPOCHS=1).
set -euo pipefail
OUT=${OUT:-/tmp/scaling}
DEVICES=${DEVICES:-0,1}
N=$(awk -F, '{print NF}' <<<"$DEVICES")
REPEAT=${REPEAT:-32}
STEPS=${STEPS:-30}
EPOCHS=${EPOCHS:-3}
mkdir -p "$OUT"
W=/tmp/coco128x32
mkdir -p $W
python3 - "$DATA/coco128" $W "$REPEAT" <<'PY'
import sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
files = sorted((src / "images" / "train2017").glob("*.jpg"))
(dst / "train.txt").write_text("".join(f"{f}\n" for _ in range(int(sys.argv[3])) for f in files))
names = "[" + ", ".join(f"'c{i}'" for i in range(80)) + "]"
(dst / "data.yaml").write_text(f"path: {dst}\ntrain: train.txt\nval: train.txt\nnames: {names}\n")
PY
cat > /tmp/pss_run.py <<'PY'
"""Run a command; record the peak summed PSS (GiB) of its process tree in the file given first."""
import subprocess, sys, time
import psutil
out, cmd = sys.argv[1], sys.argv[2:]
p = subprocess.Popen(cmd)
root, peak = psutil.Process(p.pid), 0.0
while p.poll() is None:
    total = 0
    for q in [root, *root.children(recursive=True)]:
        try:
            total += q.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    peak = max(peak, total / 2**30)
    time.sleep(0.5)
open(out, "w").write(f"{peak:.3f}\n")
sys.exit(p.returncode)
PY
B="bench train --cfg yolov9-s --data $W/data.yaml --img 640 --batch 128 --amp bf16 --steps $STEPS --warmup 10 --workers 8 --cache ram"
yolov9 $B --device 0 --out "$OUT/bench_1gpu.json"
CUDA_VISIBLE_DEVICES=$DEVICES python3 -m torch.distributed.run --standalone --nproc-per-node "$N" -m yolov9 $B --out "$OUT/bench_2gpu.json"
T="train --data $W/data.yaml --cfg yolov9-s --img 640 --epochs $EPOCHS --cache ram --workers 8 --no-val --project /tmp/runs --exist-ok"
python3 /tmp/pss_run.py "$OUT/ram_1gpu.txt" yolov9 $T --batch 128 --device 0 --name g1
python3 /tmp/pss_run.py "$OUT/ram_1gpu_b256.txt" yolov9 $T --batch $((128 * N)) --device 0 --name g1b256
python3 /tmp/pss_run.py "$OUT/ram_2gpu.txt" yolov9 $T --batch $((128 * N)) --device "$DEVICES" --name g2
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = lambda n: [json.loads(x) for x in Path(f"/tmp/runs/{n}/results.jsonl").read_text().splitlines()]
b1, b2 = (json.loads((out / f"bench_{k}.json").read_text())[0] for k in ("1gpu", "2gpu"))
g1, g1b, g2 = rows("g1"), rows("g1b256"), rows("g2")
ram = {k: float((out / f"ram_{k}.txt").read_text()) for k in ("1gpu", "1gpu_b256", "2gpu")}
summary = {
    "gpus": b2["gpus"],
    "scaling": {
        "bench_train": round(b2["images_per_s"] / b1["images_per_s"], 3),
        "train_epoch3": round(g2[-1]["images_per_s"] / g1[-1]["images_per_s"], 3),
    },
    "bench_images_per_s": {"1gpu": b1["images_per_s"], "2gpu": b2["images_per_s"]},
    "train_images_per_s": {"1gpu": [r["images_per_s"] for r in g1], "2gpu": [r["images_per_s"] for r in g2]},
    "host_ram_peak_gib": ram,
    "host_ram_ratio_2gpu_vs_1gpu": round(ram["2gpu"] / ram["1gpu"], 3),
    "loss_items_same_global_batch": {
        "1gpu": [[r["box"], r["cls"], r["dfl"]] for r in g1b],
        "2gpu": [[r["box"], r["cls"], r["dfl"]] for r in g2],
    },
}
(out / "scaling_2gpu.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
PY
