#!/usr/bin/env bash
# The serving-throughput measurement on one H200 (issue "Serving, second step"): the README's recipe with the GPU's
# JPEG decoder, before and after. Longer than one `run` call may take: start it detached, collect it from later calls
# (each within the machine's idle release):
#   source .gpu/bootstrap.sh && R=/tmp/s27 setsid nohup bash docs/scripts/serving_gpu.sh >/tmp/s27.log 2>&1 &
#   sleep 500; tar -C /tmp -czf $OUT/s27.tgz s27 s27.log          (repeat until /tmp/s27/done exists)
# Needs the wheelhouse with nvImageCodec: ../shared/gpu/make-wheelhouse.sh nvidia-nvimgcodec-cu13==0.9.0.20
# (libnvjpeg comes from nvidia-nvjpeg; where it is not carried, NVJPEG_LIB points at another copy, e.g. torchvision's).
# BEFORE: a checkout of the code before the gateway fix (git archive a072e25 | tar -x -C .gpu/before), its gateway
# measured against the same Triton. Each step runs under its own timeout, so one that fails costs its limit only.
set -uo pipefail
R=${R:-/tmp/s27}
DATA=${DATA:-../shared/datasets}
BEFORE=${BEFORE:-.gpu/before}
EPOCHS=${EPOCHS:-80}
DUR=${DUR:-10}
mkdir -p "$R/imgs"
if [ -n "${NVJPEG_LIB:-}" ]; then mkdir -p /tmp/nvj && ln -sf "$NVJPEG_LIB" /tmp/nvj/libnvjpeg.so.13 && export LD_LIBRARY_PATH=/tmp/nvj:$LD_LIBRARY_PATH; fi
cp "$DATA"/tiny_coco_val/val2017/*.jpg "$DATA"/coco128/images/train2017/*.jpg "$R/imgs/"
step() { local t=$1 name=$2; shift 2; SECONDS=0; timeout "$t" "$@" >"$R/$name.log" 2>&1; echo "$name: exit $? in ${SECONDS}s" | tee -a "$R/steps.txt"; }
stop_stack() {  # the next server needs the ports: wait until the old processes are gone
  pkill -f "serve.gateway.workers"; pkill -f "yolov9 serve triton"; pkill -f tritonserver
  for _ in $(seq 1 60); do pgrep -f "tritonserver|serve.gateway.workers" >/dev/null || return 0; sleep 1; done
  pkill -9 -f "tritonserver|serve.gateway.workers"; sleep 2
}
wait_url() { for _ in $(seq 1 "$2"); do curl -sf "$1" >/dev/null && return 0; sleep 1; done; return 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$R/gpu.txt"

step 240 gpu_tests python3 -m pytest -q -p no:cacheprovider tests/core/test_decode.py tests/serve/test_detector.py
printf 'mosaic: 0.0\nmixup: 0.0\nscale: 0.2\ntranslate: 0.05\n' > "$R/light.yaml"
step 300 train yolov9 train --data "$DATA/coco128" --cfg yolov9-s --img 640 --epochs "$EPOCHS" --batch 16 --hyp "$R/light.yaml" \
  --close-mosaic 0 --cache ram --workers 12 --no-val --project "$R/runs" --name fit --exist-ok
W=$R/runs/fit/weights/last.pt
step 330 export yolov9 export aoti "$W" -o "$R/fl.pt2" --max-batch 64
for d in nvimgcodec nvjpeg cpu; do
  step 120 "bench_detector_$d" yolov9 bench detector "$R/fl.pt2" --images "$R/imgs" --batches 1,8,32,64 --iters 20 \
    --decoder "$d" --out "$R/bench_detector_$d.json"
done

# the recipe: 6 instances under MPS, 12 gateway workers; the decoder as auto picks it
yolov9 serve build-repo --engine "$R/fl.pt2" --repo "$R/repo" --kind gpu --instances 6 --max-batch 64 --queue-delay-us 1000 > "$R/build.log" 2>&1
(yolov9 serve triton --repo "$R/repo" --mps --log "$R/triton.log" > "$R/triton_cmd.log" 2>&1 &)
wait_url http://127.0.0.1:8000/v2/models/yolov9/ready 240; echo "triton ready: $? after ${SECONDS}s" >> "$R/steps.txt"
(yolov9 serve gateway --workers 12 > "$R/gateway.log" 2>&1 &)
wait_url http://127.0.0.1:8080/readyz 60
if [ -d "$BEFORE" ]; then
  (cd "$BEFORE" && PYTHONPATH=$PWD:/tmp/site YOLOV9_TRITON_URLS=127.0.0.1:8001 python3 -m yolov9.serve.gateway.workers \
     --workers 12 --port 8090 > "$R/gateway_before.log" 2>&1 &)
  wait_url http://127.0.0.1:8090/readyz 60
fi
curl -s http://127.0.0.1:8080/v1/models > "$R/models.json"
LT="yolov9 loadtest --images $R/imgs --duration $DUR --warmup 3 --procs 4 --triton-metrics http://127.0.0.1:8002/metrics"
step 200 lt_gateway $LT --target gateway --concurrency 1,8,64,128,160,256 --out "$R/lt_gateway.json"
step 200 lt_triton $LT --target triton --url 127.0.0.1:8001 --concurrency 1,8,64,128,160,256 --out "$R/lt_triton.json"
[ -d "$BEFORE" ] && step 120 lt_gateway_before $LT --target gateway --url http://127.0.0.1:8090 --concurrency 8,64,160 --out "$R/lt_gateway_before.json"
step 120 val_url yolov9 val --url http://127.0.0.1:8080 --data "$DATA/coco128" --out "$R/val_url.json"
step 120 val_engine yolov9 val "$R/fl.pt2" --data "$DATA/coco128" --square --out "$R/val_engine.json"
curl -s http://127.0.0.1:8002/metrics | grep -E "^yolov9_|^nv_inference_(count|exec_count|queue|compute_infer)" > "$R/triton_metrics.txt"
stop_stack

# the same recipe with nvImageCodec's hardware decoder in the six instances (auto picks nvJPEG)
yolov9 serve build-repo --engine "$R/fl.pt2" --repo "$R/repo_nvimgcodec" --kind gpu --instances 6 --max-batch 64 --queue-delay-us 1000 --decoder nvimgcodec > "$R/build2.log" 2>&1
(yolov9 serve triton --repo "$R/repo_nvimgcodec" --mps --log "$R/triton2.log" > "$R/triton2_cmd.log" 2>&1 &)
wait_url http://127.0.0.1:8000/v2/models/yolov9/ready 240
(yolov9 serve gateway --workers 12 > "$R/gateway2.log" 2>&1 &)
wait_url http://127.0.0.1:8080/readyz 60
curl -s http://127.0.0.1:8080/v1/models > "$R/models_nvimgcodec.json"
step 150 lt_triton_nvimgcodec $LT --target triton --url 127.0.0.1:8001 --concurrency 8,64,160,256 --out "$R/lt_triton_nvimgcodec.json"
step 150 lt_gateway_nvimgcodec $LT --target gateway --concurrency 8,64,160,256 --out "$R/lt_gateway_nvimgcodec.json"
stop_stack
touch "$R/done"
