"""The gateway of two checkouts against the same stand-in Triton (serve/stub_triton.py), one worker each, the CPU
milliseconds per request of each: how the gateway's regression was found and its fix checked on the CPU.

    python docs/scripts/gateway_ab.py OUT.json SRC:MODULE [SRC:MODULE ...]
    e.g. git worktree add /tmp/old 33d1fa3^ && python docs/scripts/gateway_ab.py ab.json \\
        /tmp/old:serve.gateway.workers .:yolov9.serve.gateway.workers"""

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from yolov9.serve.bench_gateway import StubTritonProcess, measure
from yolov9.serve.config import BenchGatewayConfig
from yolov9.serve.loadtest import load_images
from yolov9.serve.processes import free_port

out, targets = Path(sys.argv[1]), sys.argv[2:]
cfg = BenchGatewayConfig(concurrency=[8, 32], duration=5)
images = load_images(cfg.images)
rows = []
with StubTritonProcess(free_port()).start() as stub:
    for target in targets:
        src, module = target.split(":")
        src = str(Path(src).resolve())
        port = free_port()
        env = {**os.environ, "PYTHONPATH": src, "YOLOV9_TRITON_URLS": stub.url}
        cmd = [sys.executable, "-m", module, "--workers", "1", "--port", str(port)]
        p = subprocess.Popen(cmd, env=env, cwd=src, start_new_session=True)
        for _ in range(150):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
                break
            except Exception:
                time.sleep(0.2)
        for c in cfg.concurrency:
            r = measure(f"http://127.0.0.1:{port}", p.pid, images, c, cfg)
            rows.append({"source": src, **r})
            print(
                f"{src} c{c}: {r['images_per_s']} requests/s, p99 {r['p99_ms']} ms, "
                f"{r['gateway_cpu_ms_per_request']} CPU ms/request",
                flush=True,
            )
        os.killpg(p.pid, 15)
        p.wait()
out.write_text(json.dumps({"cpu": os.cpu_count(), "rows": rows}, indent=1))
