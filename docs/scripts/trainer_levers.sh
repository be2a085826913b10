#!/usr/bin/env bash
# The trainer-throughput measurement on one H200 (issue "Trainer throughput"). It takes longer than one `run` call
# may (10 minutes), so start it detached and collect it from later calls (each within the machine's idle release):
#   source .gpu/bootstrap.sh && OUT=/tmp/levers setsid nohup bash docs/scripts/trainer_levers.sh >/tmp/levers.log 2>&1 &
#   sleep 540; cp -r /tmp/levers /tmp/levers.log $OUT/        (repeat until /tmp/levers/trainer_levers.json exists)
# The GPU tests need pytest in the wheelhouse: ../shared/gpu/make-wheelhouse.sh pytest pluggy iniconfig
# 1. the GPU tests of the step (sync-free step, CUDA graph = eager), if pytest is installed;
# 2. `bench train` on coco128 for yolov9-s, gelan-s and yolov9-c at batch 128 and yolov9-s at batch 16, --amp
#    fp16,bf16, without and with --cuda-graph: one JSON per run in $OUT;
# 3. `yolov9 train` for 3 epochs on coco128 replicated x32 (4,096 images) at batch 128, RAM cache, as a user runs it
#    (validation on coco128 itself), with its epoch rates.
# Writes $OUT/trainer_levers.json (every bench row, the train rows). Each step runs under its own timeout, so one
# that fails or hangs costs its limit and the rest still run. Overrides: MODELS ("cfg:batch ..."), GRAPHS, COMPILE
# (torch.compile modes, "off layers model"), AMP, STEPS, WARMUP, EPOCHS, REPEAT, DEVICE, IMG, TESTS (pytest's -k
# expression; "none" skips the tests), TRAIN (0 skips step 3), PROFILE (1: --profile tables beside each bench),
# LIMIT (seconds per bench; compiling counts in it), TRAIN_CFG (step 3's model), TRAIN_ARGS (more `yolov9 train`
# options), BENCH_ARGS (more `bench train` options), TAG (appended to the result names, so runs with other ARGS sit
# beside each other), TRAIN_LIMIT (step 3's timeout in seconds, 900). A train step that reaches it is stopped with
# SIGABRT, so faulthandler prints where each thread waited; $YOLOV9_STALL_S below it prints that without stopping.
# A dry run on the CPU: DEVICE=cpu MODELS=gelan-t:4 IMG=96 GRAPHS=--no-cuda-graph AMP=bf16 STEPS=2 WARMUP=1 EPOCHS=1 REPEAT=1.
set -uo pipefail
OUT=${OUT:-/tmp/levers}
DATA=${DATA:-../shared/datasets}
MODELS=${MODELS:-yolov9-s:128 gelan-s:128 yolov9-c:128 yolov9-s:16}
GRAPHS=${GRAPHS:---no-cuda-graph --cuda-graph}
COMPILE=${COMPILE:-off}
TESTS=${TESTS:-}
TRAIN=${TRAIN:-1}
PROFILE=${PROFILE:-0}
LIMIT=${LIMIT:-420}
TRAIN_ARGS=${TRAIN_ARGS:-}
TRAIN_CFG=${TRAIN_CFG:-yolov9-s}
BENCH_ARGS=${BENCH_ARGS:-}
TAG=${TAG:-}
AMP=${AMP:-fp16,bf16}
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-10}
EPOCHS=${EPOCHS:-3}
REPEAT=${REPEAT:-32}
DEVICE=${DEVICE:-0}
IMG=${IMG:-640}
WORKERS=${WORKERS:-14}
mkdir -p "$OUT"
if [ "$TESTS" != none ] && python3 -c "import pytest" 2>/dev/null; then
  timeout 600 python3 -m pytest -q -p no:cacheprovider tests/train/test_step.py ${TESTS:+-k "$TESTS"} \
    >"$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests: exit $?" | tee -a "$OUT/gpu_tests.txt"
fi
for m in $MODELS; do
  [ "$m" = none ] && continue
  for g in $GRAPHS; do
    for c in $COMPILE; do
      name="${m%%:*}_b${m##*:}_${g#--}_compile-$c$TAG"
      prof=()
      [ "$PROFILE" = 1 ] && prof=(--profile "$OUT/profile_$name.txt")
      timeout "$LIMIT" yolov9 bench train --cfg "${m%%:*}" --batch "${m##*:}" --data "$DATA/coco128" --img "$IMG" \
        --amp "$AMP" --steps "$STEPS" --warmup "$WARMUP" --workers "$WORKERS" --cache ram --device "$DEVICE" $g \
        --compile "$c" $BENCH_ARGS "${prof[@]}" --out "$OUT/bench_$name.json" >"$OUT/bench_$name.log" 2>&1
      echo "bench $name: exit $?"
    done
  done
done
W=/tmp/coco128x$REPEAT
if [ "$TRAIN" = 1 ]; then
mkdir -p "$W"
python3 - "$DATA/coco128" "$W" "$REPEAT" <<'PY'
import json, sys
from pathlib import Path
from yolov9.core.coco_names import COCO_NAMES
src, dst, n = Path(sys.argv[1]).resolve(), Path(sys.argv[2]), int(sys.argv[3])
files = sorted(p for p in (src / "images").rglob("*.jpg"))
(dst / "train.txt").write_text("".join(f"{f}\n" for _ in range(n) for f in files))
(dst / "val.txt").write_text("".join(f"{f}\n" for f in files))
(dst / "data.yaml").write_text(f"path: {dst}\ntrain: train.txt\nval: val.txt\nnames: {json.dumps(COCO_NAMES)}\n")
PY
timeout -s ABRT ${TRAIN_LIMIT:-900} yolov9 train --data "$W/data.yaml" --cfg "$TRAIN_CFG" --img "$IMG" --epochs "$EPOCHS" --batch 128 --cache ram \
  --workers "$WORKERS" --device "$DEVICE" --project /tmp/levers_runs --name x$REPEAT$TAG --exist-ok $TRAIN_ARGS >"$OUT/train.log" 2>&1
echo "train: exit $?"
fi
python3 - "$OUT" "/tmp/levers_runs/x$REPEAT$TAG/results.jsonl" <<'PY'
import json, sys
from pathlib import Path
out, runs = Path(sys.argv[1]), Path(sys.argv[2])
bench = [dict(r, run=p.stem) for p in sorted(out.glob("bench_*.json")) for r in json.loads(p.read_text())]
train = [json.loads(x) for x in runs.read_text().splitlines()] if runs.exists() else []
keys = ("epoch", "images_per_s", "data_wait", "box", "cls", "dfl", "map", "map50", "first_step_s",
        "start_to_first_step_s", "first_batch_s", "startup_s", "compile_cache_hits", "compile_cache_misses", "compile_s",
        "forward_compiled", "loss_compiled")
summary = {"bench": bench, "train": [{k: r.get(k) for k in keys} for r in train]}
(out / "trainer_levers.json").write_text(json.dumps(summary, indent=1))
for r in bench:
    print(f"{r['run']:38s} {r['amp']:5s} {r['images_per_s']:8.1f} img/s  busy {r['gpu_busy_pct']}%  "
          f"mem {r['peak_memory_gib']} GiB  mfu {r['mfu']}")
for r in summary["train"]:
    print(f"train epoch {r['epoch']}: {r['images_per_s']:.1f} img/s, first step {r['first_step_s']} s")
PY
