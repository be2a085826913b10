#!/usr/bin/env bash
# Does a faster training mode train the same? `yolov9 train` on coco128 (yolov9-s, batch 16, EPOCHS epochs, same
# seed) eagerly (--no-cuda-graph) and in the mode under test (MODE_ARGS; default: the trainer's defaults), both at
# once on one GPU (what is compared is the loss and mAP, not the speed). Writes $OUT/accuracy.json: each run's loss
# items at the epochs in AT, their relative differences, and the final mAP. Takes longer than one `run` call may:
# start it detached as docs/scripts/trainer_levers.sh says. A dry run on the CPU:
#   DEVICE=cpu EPOCHS=2 AT=0,1 IMG=64 WORKERS=1 OUT=/tmp/acc bash docs/scripts/trainer_accuracy.sh
set -uo pipefail
OUT=${OUT:-/tmp/accuracy}
DATA=${DATA:-../shared/datasets}
EPOCHS=${EPOCHS:-150}
AT=${AT:-0,50,100,145}
MODE_ARGS=${MODE_ARGS:-}
DEVICE=${DEVICE:-0}
IMG=${IMG:-640}
WORKERS=${WORKERS:-6}
LIMIT=${LIMIT:-1200}
mkdir -p "$OUT"
run() {  # name, extra options
  timeout "$LIMIT" yolov9 train --data "$DATA/coco128" --cfg yolov9-s --img "$IMG" --epochs "$EPOCHS" \
    --batch 16 --cache ram --workers "$WORKERS" --device "$DEVICE" --seed 0 --val-interval 50 \
    --project "$OUT/runs" --name "$1" --exist-ok "${@:2}" >"$OUT/$1.log" 2>&1
  echo "$1: exit $?" >>"$OUT/steps.txt"
}
run eager --no-cuda-graph &
run mode $MODE_ARGS &
wait
python3 - "$OUT" "$AT" "$MODE_ARGS" <<'PY'
import json, sys
from pathlib import Path
out, at, mode = Path(sys.argv[1]), [int(a) for a in sys.argv[2].split(",")], sys.argv[3] or "defaults"
rows = {n: [json.loads(x) for x in (out / "runs" / n / "results.jsonl").read_text().splitlines()]
        for n in ("eager", "mode") if (out / "runs" / n / "results.jsonl").exists()}
report = {"mode": mode, "epochs": {}, "final": {}}
for e in at:
    if all(len(r) > e for r in rows.values()) and len(rows) == 2:
        a, b = rows["eager"][e], rows["mode"][e]
        report["epochs"][e] = {k: {"eager": a[k], "mode": b[k], "rel_diff": (b[k] - a[k]) / a[k]}
                               for k in ("box", "cls", "dfl")}
for n, r in rows.items():
    report["final"][n] = {k: r[-1].get(k) for k in ("epoch", "map", "map50")}
(out / "accuracy.json").write_text(json.dumps(report, indent=1))
print(json.dumps(report, indent=1))
PY
