#!/usr/bin/env bash
# CPU load test through one Triton server and through two behind one gateway, and a failover run (one of the two
# servers killed with SIGKILL under load), as in docs/benchmarks.md. Usage: bash docs/scripts/two_servers_cpu.sh
# CHECKPOINT OUT_DIR (a gelan-t checkpoint is enough; the model runs at 320 px on the CPU).
set -uo pipefail
CK=$1; OUT=$2; mkdir -p "$OUT"
serve() {  # serve K servers in the background, wait until the gateway answers
  yolov9 serve --weights "$CK" --kind cpu --img 320 --servers "$1" --workers 2 --port 18080 \
    --triton-http-port 18000 --triton-grpc-port 18001 --triton-metrics-port 18002 --repo "$OUT/repo$1" \
    > "$OUT/serve$1.log" 2>&1 &
  SERVE=$!
  for _ in $(seq 600); do curl -sf http://127.0.0.1:18080/readyz >/dev/null && return; sleep 0.5; done
  echo "serve $1 did not come up"; exit 1
}
for k in 1 2; do
  serve $k
  yolov9 loadtest --url http://127.0.0.1:18080 --concurrency 2,4,8 --duration 15 --warmup 3 --out "$OUT/servers$k.json"
  kill -TERM $SERVE; wait $SERVE
done
serve 2
yolov9 loadtest --url http://127.0.0.1:18080 --concurrency 4 --duration 24 --warmup 2 --timeline \
  --out "$OUT/failover.json" &
LOAD=$!
sleep 10; pkill -9 -f -- "--grpc-port=18011"; echo "killed the second server at $(date +%T)"
wait $LOAD
kill -TERM $SERVE; wait $SERVE
yolov9 loadtest --plot "$OUT/servers1.json" "$OUT/servers2.json" --out "$OUT/servers_1_vs_2.json"
