#!/usr/bin/env bash
# The serving-throughput measurement on one H200 (issue "Serving, second step"): the README's recipe with the GPU's
# JPEG decoder, before and after. Longer than one `run` call may take: start it detached, collect it from later calls
# (each within the machine's idle release):
#   source .gpu/bootstrap.sh && R=/tmp/s27 setsid nohup bash docs/scripts/serving_gpu.sh >/tmp/s27.log 2>&1 &
#   sleep 500; tar -C /tmp -czf $OUT/s27.tgz s27 s27.log          (repeat until /tmp/s27/done exists)
# Needs nvImageCodec on the box: the wheelhouse (../shared/gpu/make-wheelhouse.sh nvidia-nvimgcodec-cu13==0.9.0.20),
# or its wheel unpacked into /tmp/site (.gpu/start17.sh: only the cp312 module and the JPEG extensions, 5 MB zipped,
# to keep the carry under 64 MiB). libnvjpeg: NVJPEG_LIB points at a copy (CUDA 13's, or torchvision's).
# Steps: the decode and detector GPU tests; a yolov9-s trained and exported; `bench detector` per decoder in one
# process and in six under MPS; a profile of batches of 1 and 8 (detector_profile.py); then the README's recipe once
# per decoder inside Triton (DECODERS: auto, which picks nvJPEG on a GPU, then nvImageCodec), each time the gateway
# and Triton direct at the same loads and `val --url`; once the gateway with GW_ALT workers instead of 12 (also in
# instances:N); LT_PROCS load-generator processes (4); last,
# Triton direct with each of QDELAYS (us) as the batcher's queue delay (ORDER: the recipe and queue-delay runs in
# another order, e.g. "recipe:auto queue_delay:0 recipe:nvimgcodec"; "instances:N" serves with N model instances).
# BEFORE (optional): a checkout of older code
# (git archive a072e25 | tar -x -C .gpu/before), its gateway measured against the first Triton. Each step runs under
# its own timeout, so one that fails costs its limit only.
set -uo pipefail
R=${R:-/tmp/s27}
DATA=${DATA:-../shared/datasets}
BEFORE=${BEFORE:-.gpu/before}
EPOCHS=${EPOCHS:-80}
DECODERS=${DECODERS:-auto nvimgcodec}
GW_ALT=${GW_ALT-6}
CONC=${CONC:-1,8,64,128,160,256}
QDELAYS=${QDELAYS:-0 200}
DUR=${DUR:-10}
BENCH_DECODERS=${BENCH_DECODERS-nvimgcodec nvjpeg cpu}
SIX_PROCS=${SIX_PROCS-nvimgcodec nvjpeg}
CHECKS=${CHECKS:-1}  # 0: skip the GPU tests, the profile and the engine's val (already measured on this code)
ENGINE=${ENGINE:-}   # an exported AOTI package to serve instead of training and exporting one
IMAGES=${IMAGES:-}   # a folder of JPEGs to send instead of tiny_coco_val's and coco128's
ICONC=${ICONC:-8,64,160,256}  # the loads of instances:N
LT_PROCS=${LT_PROCS:-4}  # load-generator processes
BUILD_ARGS=${BUILD_ARGS:-}  # more build-repo options for every repository, e.g. "--gpu-wait spin"
mkdir -p "$R/imgs"
if [ -n "${NVJPEG_LIB:-}" ]; then mkdir -p /tmp/nvj && ln -sf "$NVJPEG_LIB" /tmp/nvj/libnvjpeg.so.13 && export LD_LIBRARY_PATH=/tmp/nvj:$LD_LIBRARY_PATH; fi
if [ -n "$IMAGES" ]; then cp "$IMAGES"/*.jpg "$R/imgs/"; else cp "$DATA"/tiny_coco_val/val2017/*.jpg "$DATA"/coco128/images/train2017/*.jpg "$R/imgs/"; fi
step() { local t=$1 name=$2; shift 2; SECONDS=0; timeout "$t" "$@" >"$R/$name.log" 2>&1; echo "$name: exit $? in ${SECONDS}s" | tee -a "$R/steps.txt"; }
stop_stack() {  # the next server needs the ports: wait until the old processes are gone
  pkill -f "serve.gateway.workers"; pkill -f "yolov9 serve triton"; pkill -f tritonserver
  for _ in $(seq 1 60); do pgrep -f "tritonserver|serve.gateway.workers" >/dev/null || return 0; sleep 1; done
  pkill -9 -f "tritonserver|serve.gateway.workers"; sleep 2
}
wait_url() { for _ in $(seq 1 "$2"); do curl -sf "$1" >/dev/null && return 0; sleep 1; done; return 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$R/gpu.txt"

[ "$CHECKS" = 1 ] && step 240 gpu_tests python3 -m pytest -q -p no:cacheprovider tests/core/test_decode.py tests/core/test_boxes.py tests/serve/test_detector.py
if [ -n "$ENGINE" ]; then cp "$ENGINE" "$R/fl.pt2"; cp "$ENGINE.json" "$R/fl.pt2.json"; else
  printf 'mosaic: 0.0\nmixup: 0.0\nscale: 0.2\ntranslate: 0.05\n' > "$R/light.yaml"
  step 300 train yolov9 train --data "$DATA/coco128" --cfg yolov9-s --img 640 --epochs "$EPOCHS" --batch 16 --hyp "$R/light.yaml" \
    --close-mosaic 0 --cache ram --workers 12 --no-val --project "$R/runs" --name fit --exist-ok
  W=$R/runs/fit/weights/last.pt
  step 330 export yolov9 export aoti "$W" -o "$R/fl.pt2" --max-batch 64
fi
for d in $BENCH_DECODERS; do
  step 120 "bench_detector_$d" yolov9 bench detector "$R/fl.pt2" --images "$R/imgs" --batches 1,8,32,64 --iters 20 \
    --decoder "$d" --out "$R/bench_detector_$d.json"
done
[ "$CHECKS" = 1 ] && step 120 detector_profile python3 docs/scripts/detector_profile.py "$R/fl.pt2" "$R/imgs" "$R/detector_profile.txt" 1,8
for d in $SIX_PROCS; do  # six processes under MPS, as six Triton instances run: do the JPEG engines pay there?
  step 150 "bench_detector_${d}_6procs" yolov9 bench detector "$R/fl.pt2" --images "$R/imgs" --batches 8,32,64 --iters 20 \
    --decoder "$d" --procs 6 --mps --out "$R/bench_detector_${d}_6procs.json"
done
[ "$CHECKS" = 1 ] && step 120 val_engine yolov9 val "$R/fl.pt2" --data "$DATA/coco128" --square --out "$R/val_engine.json"

LT="yolov9 loadtest --images $R/imgs --duration $DUR --warmup 3 --procs $LT_PROCS --triton-metrics http://127.0.0.1:8002/metrics"
start_gateway() {  # workers, log
  (yolov9 serve gateway --workers "$1" > "$2" 2>&1 &)
  wait_url http://127.0.0.1:8080/readyz 60; echo "gateway ($1 workers) ready: $?" >> "$R/steps.txt"
}
# the recipe: 6 instances under MPS, 12 gateway workers
recipe() {  # decoder inside Triton
  local dec=$1
  yolov9 serve build-repo --engine "$R/fl.pt2" --repo "$R/repo_$dec" --kind gpu --instances 6 --max-batch 64 \
    --decoder "$dec" $BUILD_ARGS > "$R/build_$dec.log" 2>&1
  SECONDS=0
  (yolov9 serve triton --repo "$R/repo_$dec" --mps --log "$R/triton_$dec.log" > "$R/triton_cmd_$dec.log" 2>&1 &)
  wait_url http://127.0.0.1:8000/v2/models/yolov9/ready 240; echo "triton ($dec) ready: $? after ${SECONDS}s" >> "$R/steps.txt"
  start_gateway 12 "$R/gateway_$dec.log"
  curl -s http://127.0.0.1:8080/v1/models > "$R/models_$dec.json"
  step 200 "lt_gateway_$dec" $LT --target gateway --concurrency "$CONC" --out "$R/lt_gateway_$dec.json"
  step 200 "lt_triton_$dec" $LT --target triton --url 127.0.0.1:8001 --concurrency "$CONC" --out "$R/lt_triton_$dec.json"
  step 120 "val_url_$dec" yolov9 val --url http://127.0.0.1:8080 --data "$DATA/coco128" --out "$R/val_url_$dec.json"
  curl -s http://127.0.0.1:8002/metrics | grep -E "^yolov9_|^nv_inference_(count|exec_count|queue|compute_infer)" > "$R/triton_metrics_$dec.txt"
  if [ "$dec" = "${DECODERS%% *}" ]; then
    if [ -n "$GW_ALT" ]; then
      pkill -f "serve.gateway.workers"; sleep 3
      start_gateway "$GW_ALT" "$R/gateway_w$GW_ALT.log"
      step 120 "lt_gateway_w$GW_ALT" $LT --target gateway --concurrency 64,160,256 --out "$R/lt_gateway_w$GW_ALT.json"
    fi
    if [ -d "$BEFORE" ]; then
      (cd "$BEFORE" && PYTHONPATH=$PWD:/tmp/site YOLOV9_TRITON_URLS=127.0.0.1:8001 python3 -m yolov9.serve.gateway.workers \
         --workers 12 --port 8090 > "$R/gateway_before.log" 2>&1 &)
      wait_url http://127.0.0.1:8090/readyz 60
      step 120 lt_gateway_before $LT --target gateway --url http://127.0.0.1:8090 --concurrency 8,64,160 --out "$R/lt_gateway_before.json"
    fi
  fi
  stop_stack
}
# the batcher's queue delay at light load and at the knee (Triton direct: the gateway adds the same to each)
queue_delay() {  # microseconds
  local q=$1
  yolov9 serve build-repo --engine "$R/fl.pt2" --repo "$R/repo_q$q" --kind gpu --instances 6 --max-batch 64 \
    --queue-delay-us "$q" $BUILD_ARGS > "$R/build_q$q.log" 2>&1
  (yolov9 serve triton --repo "$R/repo_q$q" --mps --log "$R/triton_q$q.log" > "$R/triton_cmd_q$q.log" 2>&1 &)
  wait_url http://127.0.0.1:8000/v2/models/yolov9/ready 240; echo "triton (queue delay $q us) ready: $?" >> "$R/steps.txt"
  step 120 "lt_triton_q$q" $LT --target triton --url 127.0.0.1:8001 --concurrency 1,8,64,160 --out "$R/lt_triton_q$q.json"
  stop_stack
}
# fewer or more model instances at the default queue delay (0): Triton direct and the gateway near the knee
instances() {  # count
  local n=$1
  yolov9 serve build-repo --engine "$R/fl.pt2" --repo "$R/repo_i$n" --kind gpu --instances "$n" --max-batch 64 $BUILD_ARGS \
    > "$R/build_i$n.log" 2>&1
  (yolov9 serve triton --repo "$R/repo_i$n" --mps --log "$R/triton_i$n.log" > "$R/triton_cmd_i$n.log" 2>&1 &)
  wait_url http://127.0.0.1:8000/v2/models/yolov9/ready 240; echo "triton ($n instances) ready: $?" >> "$R/steps.txt"
  start_gateway 12 "$R/gateway_i$n.log"
  step 150 "lt_triton_i$n" $LT --target triton --url 127.0.0.1:8001 --concurrency "$ICONC" --out "$R/lt_triton_i$n.json"
  step 150 "lt_gateway_i$n" $LT --target gateway --concurrency "$ICONC" --out "$R/lt_gateway_i$n.json"
  if [ -n "$GW_ALT" ]; then  # the same Triton behind GW_ALT gateway workers
    pkill -f "serve.gateway.workers"; sleep 3
    start_gateway "$GW_ALT" "$R/gateway_i${n}_w$GW_ALT.log"
    step 120 "lt_gateway_i${n}_w$GW_ALT" $LT --target gateway --concurrency 64,160,256 --out "$R/lt_gateway_i${n}_w$GW_ALT.json"
  fi
  stop_stack
}
ORDER=${ORDER:-$(for d in $DECODERS; do printf 'recipe:%s ' "$d"; done; for q in $QDELAYS; do printf 'queue_delay:%s ' "$q"; done)}
for item in $ORDER; do "${item%%:*}" "${item#*:}"; done
touch "$R/done"
