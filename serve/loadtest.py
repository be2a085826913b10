"""`yolov9 loadtest`: closed-loop concurrency sweeps or open-loop request rates against the gateway (HTTP) or
Triton (gRPC), with real images, connection reuse and optionally several client processes. Reports throughput,
latency percentiles, errors by kind and the client's own CPU use; writes JSON, CSV and a latency/throughput PNG."""

from __future__ import annotations

import asyncio
import csv
import json
import multiprocessing as mp
import os
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from yolov9.core import figures
from yolov9.core.errors import BadInput, MissingInput, Unavailable
from yolov9.serve.config import LoadtestConfig

IMG_SUFFIXES = (".jpg", ".jpeg", ".png")


@dataclass
class Step:
    target: str
    url: str
    model: str
    concurrency: int | None
    rate: float | None
    warmup: float
    duration: float
    requests: int | None
    conf: float
    timeout: float
    timeline: bool = False  # per-second counts and p99, for failover and roll-out runs


def load_images(folder: str | Path, limit: int = 512) -> list[bytes]:
    files = sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in IMG_SUFFIXES)[:limit]
    if not files:
        raise MissingInput(f"{folder}: no images to send")
    return [f.read_bytes() for f in files]


def _error_kind(status: int | None, exc: BaseException | None) -> str:
    if exc is not None:
        name = type(exc).__name__.lower()
        return "timeout" if "timeout" in name or "deadline" in str(exc).lower() else f"client:{type(exc).__name__}"
    return f"http_{status}"


def _client(step: Step):
    """(send, close) for the step's target: send(image bytes) -> (error kind or '', backend seconds or None)."""
    if step.target == "gateway":
        import aiohttp

        conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=step.timeout))
        url = f"{step.url.rstrip('/')}/v1/detect?conf={step.conf}"

        async def send(data: bytes) -> tuple[str, float | None]:
            async with session.post(url, data=data, headers={"Content-Type": "image/jpeg"}) as r:
                body = await r.read()
                if r.status != 200:
                    return _error_kind(r.status, None), None
                return "", json.loads(body)["latency_ms"] / 1000

        return send, session.close
    from yolov9.serve.gateway.backend import infer_stub, triton_request

    stub = infer_stub(step.url)

    async def send(data: bytes) -> tuple[str, float | None]:
        request = triton_request(data, step.conf)  # the very request the gateway sends, the same way
        request.model_name = step.model
        await stub.ModelInfer(request, timeout=step.timeout)
        return "", None

    return send, stub.channel.close


def split_load(step: Step, procs: int) -> list[tuple[float, int]]:
    """Each client process's (share of the rate and request cap, closed-loop senders). Concurrency is the total in
    flight: never more processes than senders, and the senders spread so that they add up to it exactly."""
    if step.rate:
        return [(1.0 / procs, 0)] * procs
    n = max(1, min(procs, step.concurrency))
    senders = [step.concurrency // n + (i < step.concurrency % n) for i in range(n)]
    return [(k / step.concurrency, k) for k in senders]


async def _run_step(step: Step, images: list[bytes], t_start: float, share: float, senders: int) -> list[tuple]:
    """Samples (start time, latency s, error kind or '', backend s or None) from this process's share of the load.
    The backend time is the gateway's own `latency_ms` (its wait on Triton): it tells whether a slow response
    was slow inside Triton or in front of it."""
    samples: list[tuple] = []
    end = t_start + step.warmup + step.duration
    budget = int(step.requests * share) if step.requests else None
    counter = [0]
    send, close = _client(step)

    async def one(k: int) -> None:
        t0 = time.perf_counter()
        try:
            kind, backend = await send(images[k % len(images)])
        except Exception as e:  # every failure is counted by kind, none stops the run
            kind, backend = _error_kind(None, e), None
        samples.append((t0, time.perf_counter() - t0, kind, backend))

    measured = [0]

    def more() -> bool:
        """Whether to send one more request; the --requests cap counts measured ones only (a fast server must
        not spend it all in the warm-up)."""
        now = time.perf_counter()
        if now >= end:
            return False
        if budget is not None and now >= t_start + step.warmup:
            if measured[0] >= budget:
                return False
            measured[0] += 1
        return True

    while time.perf_counter() < t_start:
        await asyncio.sleep(0.001)
    if step.rate:  # open loop: send on schedule whatever the responses do
        interval = 1.0 / (step.rate * share)
        tasks, nxt = [], time.perf_counter()
        while more():
            tasks.append(asyncio.create_task(one(counter[0])))
            counter[0] += 1
            nxt += interval
            await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
        await asyncio.gather(*tasks)
    else:

        async def worker(w: int) -> None:
            while more():
                counter[0] += 1
                await one(counter[0] + w)

        await asyncio.gather(*(worker(w) for w in range(senders)))
    await close()
    return samples


def _proc_main(step: Step, images: list[bytes], t_start: float, share: float, senders: int, q) -> None:
    cpu0 = time.process_time()
    samples = asyncio.run(_run_step(step, images, t_start, share, senders))
    q.put((samples, time.process_time() - cpu0))


TRITON_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_exec_count",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_count",
    "yolov9_execute_images",  # the images yolov9_execute_seconds{stage} covers (serve/triton/model.py)
)
STAGE_SECONDS = "yolov9_execute_seconds"


def scrape_triton(url: str | None) -> dict[str, float]:
    if not url:
        return {}
    try:
        text = urllib.request.urlopen(url, timeout=3).read().decode()
    except OSError:
        return {}
    from prometheus_client.parser import text_string_to_metric_families

    # summed over models and instances (stage seconds per stage, as "yolov9_execute_seconds:decode"); the parser
    # names counter samples with a _total suffix Triton's own counters do not have
    out = dict.fromkeys(TRITON_COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name == STAGE_SECONDS:
                name = f"{name}:{sample.labels.get('stage')}"
                out.setdefault(name, 0.0)
            if name in out:
                out[name] += sample.value
    return out


# the serving processes of this machine by part, told by their command lines and looked for in this order (a
# model's stub runs from the server's own folder, .../tritonserver/backends/python/triton_python_backend_stub); a
# gateway's spawned workers count with the supervisor that started them
_PARTS = {
    "stubs": ("triton_python_backend_stub",),
    "triton": ("tritonserver",),
    "gateway": ("yolov9.serve.gateway",),  # the supervisor (-m yolov9.serve.gateway.workers) or uvicorn's app
}


def _part_of(cmd: str) -> str | None:
    """The serving part a command line belongs to (_PARTS)."""
    return next((part for part, marks in _PARTS.items() if any(m in cmd for m in marks)), None)


CpuSeconds = tuple[float, dict[tuple[int, float], tuple[str, float]]]


def _cpu_seconds() -> CpuSeconds:
    """CPU seconds so far: the machine's busy time, and each serving process's by (pid, start time) with its part.
    Read before and after a step, `cores_busy` says how many cores each part kept busy: whether the box ran out of
    CPU."""
    import psutil

    t = psutil.cpu_times()
    procs: dict[tuple[int, float], tuple[str, float]] = {}
    for p in psutil.process_iter():
        try:
            part = _part_of(" ".join(p.cmdline()[:4]))
            if part is None:
                continue
            for q in [p, *p.children(recursive=True)] if part == "gateway" else [p]:
                c = q.cpu_times()
                procs.setdefault((q.pid, q.create_time()), (part, c.user + c.system))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return sum(t) - t.idle - getattr(t, "iowait", 0.0), procs


def cores_busy(before: CpuSeconds, after: CpuSeconds, wall: float) -> dict[str, float]:
    """The cores the machine ("host") and each serving part kept busy between two `_cpu_seconds` readings, process
    by process: one that ended in between (a stopped server's stubs) drops out instead of taking its whole past
    off its part, and one that started counts from zero."""
    busy = {"host": after[0] - before[0], **dict.fromkeys(_PARTS, 0.0)}
    for key, (part, cpu) in after[1].items():
        busy[part] += cpu - before[1].get(key, (part, 0.0))[1]
    return {k: round(v / wall, 2) for k, v in busy.items()}


def summarize(samples: list[tuple], t_start: float, warmup: float, cpu_s: float, wall: float) -> dict:
    kept = [s for s in samples if s[0] >= t_start + warmup]
    ok = np.array([lat for _, lat, kind, _ in kept if not kind]) * 1000
    backend = np.array([b for _, _, kind, b in kept if not kind and b is not None]) * 1000
    errors: dict[str, int] = {}
    for _, _, kind, _ in kept:
        if kind:
            errors[kind] = errors.get(kind, 0) + 1
    span = (max(s[0] + s[1] for s in kept) - min(s[0] for s in kept)) if kept else 0.0
    pct = (lambda q: round(float(np.percentile(ok, q)), 2)) if len(ok) else (lambda q: None)
    row = {
        "requests": len(kept),
        "ok": int(len(ok)),
        "errors": errors,
        "requests_per_s": round(len(ok) / span, 1) if span else 0.0,
        "images_per_s": round(len(ok) / span, 1) if span else 0.0,
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p95_ms": pct(95),
        "p99_ms": pct(99),
        "max_ms": round(float(ok.max()), 2) if len(ok) else None,
        "client_cpu_pct": round(100 * cpu_s / wall, 1) if wall else None,
    }
    if len(backend):  # gateway target: the part of each latency spent waiting on Triton, as the gateway saw it
        row["backend_p50_ms"] = round(float(np.percentile(backend, 50)), 2)
        row["backend_p99_ms"] = round(float(np.percentile(backend, 99)), 2)
    return row


def timeline(samples: list[tuple], t0: float) -> list[dict]:
    """Per second since t0 (by each request's start): answered, failed, and the p99 of the answered in ms."""
    seconds: dict[int, list] = {}
    for start, lat, kind, _ in samples:
        if start >= t0:
            seconds.setdefault(int(start - t0), []).append((lat, kind))
    out = []
    for sec in range(max(seconds) + 1 if seconds else 0):
        rows = seconds.get(sec, [])
        ok = [lat * 1000 for lat, kind in rows if not kind]
        p99 = round(float(np.percentile(ok, 99)), 2) if ok else None
        out.append({"second": sec, "ok": len(ok), "errors": len(rows) - len(ok), "p99_ms": p99})
    return out


def run_step(step: Step, images: list[bytes], procs: int = 1, metrics_url: str | None = None) -> dict:
    before = scrape_triton(metrics_url)
    cpu_before = _cpu_seconds()
    t_start = time.perf_counter() + 0.5
    wall0 = time.perf_counter()
    loads = split_load(step, procs)
    if len(loads) == 1:
        cpu0 = time.process_time()
        samples = asyncio.run(_run_step(step, images, t_start, *loads[0]))
        cpu = time.process_time() - cpu0
    else:
        ctx = mp.get_context("fork")  # perf_counter is CLOCK_MONOTONIC: shared by forked children
        q = ctx.Queue()
        ps = [ctx.Process(target=_proc_main, args=(step, images, t_start, *load, q)) for load in loads]
        for p in ps:
            p.start()
        parts = [q.get() for _ in ps]
        for p in ps:
            p.join()
        samples = [s for part, _ in parts for s in part]
        cpu = sum(c for _, c in parts)
    wall = time.perf_counter() - wall0
    cpu_after = _cpu_seconds()
    row = {
        "target": step.target,
        "concurrency": step.concurrency,
        "rate": step.rate,
        "procs": len(loads),
        "client_cores": os.cpu_count(),
        **summarize(samples, t_start, step.warmup, cpu, wall),
    }
    # cores kept busy during the step: the whole machine and the serving parts found on it (this load generator's
    # own share is client_cpu_pct)
    row["cores_busy"] = cores_busy(cpu_before, cpu_after, wall)
    if step.timeline:
        row["timeline"] = timeline(samples, t_start + step.warmup)
    after = scrape_triton(metrics_url)
    if before and after:
        d = {k: after[k] - before.get(k, 0.0) for k in after}
        if d.get("nv_inference_request_success"):
            row["triton_queue_ms"] = round(
                d["nv_inference_queue_duration_us"] / d["nv_inference_request_success"] / 1000, 3
            )
            row["triton_compute_ms"] = round(
                d["nv_inference_compute_infer_duration_us"] / d["nv_inference_request_success"] / 1000, 3
            )
        if d.get("nv_inference_exec_count"):
            row["triton_avg_batch"] = round(d["nv_inference_count"] / d["nv_inference_exec_count"], 2)
        if d.get("yolov9_execute_images"):  # where the model instances' time went, per image
            row["instance_ms_per_image"] = {
                k.split(":", 1)[1]: round(1000 * v / d["yolov9_execute_images"], 3)
                for k, v in d.items()
                if k.startswith(STAGE_SECONDS + ":")
            }
    return row


def write_outputs(rows: list[dict], out: Path, meta: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "steps": rows}, indent=1))
    # the union of the steps' columns: a step may lack the optional ones (Triton metrics, backend times)
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in ("errors", "timeline")] + ["errors"]
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in r.items() if k != "timeline"})
    plot_runs([(f"{meta['target']} {meta['url']}", rows)], out.with_suffix(".png"))
    if any("timeline" in r for r in rows):
        plot_timeline(rows, out.with_name(out.stem + "_timeline.png"))


def plot_timeline(rows: list[dict], png: Path) -> None:
    """Requests and errors per second (left axis) and the p99 latency of each second (right), one panel per
    step: what a failover or a roll-out does to clients."""
    steps = [r for r in rows if "timeline" in r]
    fig, axes = figures.subplots(len(steps), 1, figsize=(10, 3.2 * len(steps)), squeeze=False)
    for ax, r in zip(axes[:, 0], steps):
        t = r["timeline"]
        sec = [x["second"] for x in t]
        ax.plot(sec, [x["ok"] for x in t], label="answered / s", color="tab:blue")
        ax.bar(sec, [x["errors"] for x in t], label="failed / s", color="tab:red", alpha=0.6)
        load = f"{r['rate']} requests/s" if r["rate"] else f"concurrency {r['concurrency']}"
        ax.set(
            xlabel="second",
            ylabel="requests",
            title=f"{r['target']}, {load}",
        )
        ax2 = ax.twinx()
        ax2.plot(sec, [x["p99_ms"] for x in t], color="tab:orange", linestyle="--", label="p99 ms")
        ax2.set_ylabel("p99 ms")
        ax.legend(loc="upper left")
        ax2.legend(loc="upper right")
    figures.save(fig, png)


def plot_runs(runs: list[tuple[str, list[dict]]], png: Path) -> None:
    """p50 (dashed) and p99 (solid) latency against images/s, one colour per run, steps labelled."""
    fig, ax = figures.subplots(figsize=(6.5, 4.2))
    for k, (label, rows) in enumerate(runs):
        color = f"C{k}"
        xs = [r["images_per_s"] for r in rows]
        ax.plot(xs, [r["p99_ms"] for r in rows], marker="o", color=color, label=f"{label} p99")
        ax.plot(xs, [r["p50_ms"] for r in rows], marker=".", ls="--", color=color, label=f"{label} p50")
        for r in rows:
            step = f"c={r['concurrency']}" if r["concurrency"] else f"{r['rate']}/s"
            xy = (r["images_per_s"], r["p99_ms"] or 0)
            ax.annotate(step, xy, xytext=(4, 4), textcoords="offset points", fontsize=7, color=color)
    ax.set_xlabel("throughput (images/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(runs[0][0] if len(runs) == 1 else "latency against throughput")
    ax.legend(fontsize=7)
    png.parent.mkdir(parents=True, exist_ok=True)
    figures.save(fig, png)


def plot_files(files: list[str], png: Path) -> None:
    """One chart from several saved results (e.g. the gateway and Triton at the same concurrencies)."""
    runs = []
    for f in files:
        if not Path(f).is_file():
            raise MissingInput(f"{f}: no such results file (loadtest --out writes them)")
        try:
            d = json.loads(Path(f).read_text())
            runs.append((f"{d['meta']['target']} ({Path(f).stem})", d["steps"]))
        except (ValueError, KeyError, TypeError):
            raise BadInput(f"{f}: not a loadtest results file (JSON with 'meta' and 'steps')") from None
    plot_runs(runs, png)


def run_loadtest(args: LoadtestConfig) -> list[dict]:
    if args.plot:
        png = Path(args.out).with_suffix(".png")
        plot_files(args.plot, png)
        print(f"wrote {png}")
        return []
    url = args.url or ("http://127.0.0.1:8080" if args.target == "gateway" else "127.0.0.1:8001")
    images = load_images(args.images)
    steps = (
        [
            Step(
                args.target,
                url,
                args.model,
                None,
                args.rate,
                args.warmup,
                args.duration,
                args.requests,
                args.conf,
                args.timeout,
                args.timeline,
            )
        ]
        if args.rate
        else [
            Step(
                args.target,
                url,
                args.model,
                int(c),
                None,
                args.warmup,
                args.duration,
                args.requests,
                args.conf,
                args.timeout,
                args.timeline,
            )
            for c in args.concurrency
        ]
    )
    rows = []
    for step in steps:
        row = run_step(step, images, args.procs, args.triton_metrics)
        print(json.dumps(row))
        rows.append(row)
    meta = {
        "target": args.target,
        "url": url,
        "images": len(images),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "procs": args.procs,
    }
    write_outputs(rows, Path(args.out), meta)
    print(f"wrote {args.out} (+ .csv, .png)")
    failed = [r for r in rows if r["requests"] and not r["ok"]]
    if failed:  # a load test of a server that never answered measured nothing: say so, with a failing exit code
        kinds = ", ".join(f"{n} {k}" for k, n in failed[0]["errors"].items())
        raise Unavailable(
            f"every request failed in {len(failed)} of {len(rows)} steps ({kinds} in the first); is {url} serving?"
        )
    return rows
