"""Can a convolution take its bias and SiLU as a fused epilogue faster than cuDNN's convolution followed by a separate
pass (issue "Serving, second step", the engine goal)? Inference form (BatchNorm folded), fp16, channels-last, on a
GPU. For each distinct convolution of the deployed model that a SiLU follows, in its shape at --batch, times:

  conv        F.conv2d with bias: cuDNN's convolution, then the bias added by torch in a second pass
  conv+silu   the same, then F.silu (three passes, eager)
  inductor    torch.compile of both: what the AOTInductor package runs (cuDNN without bias, one Triton pass)
  triton      torch.compile with max_autotune and Triton convolution templates only (the epilogue fused in)
  cudnn       a cuDNN graph conv_fprop -> bias -> swish through the cuDNN frontend (`pip install
              nvidia-cudnn-frontend`; skipped where `import cudnn` fails), its runtime-fused kernel

Each method's calls are timed as the engine runs them: REPS calls captured in one CUDA graph (--no-graph: launched
back to back), so the time is the GPU's and not the launch's.
Prints one JSON line per shape (milliseconds per call, median of --iters, and how many layers have that shape) and
the model's totals per method. The compiled methods cost seconds to minutes per shape: `--methods` and
`--max-shapes` (the largest inputs first) bound the run.

    python docs/scripts/conv_epilogue_probe.py --cfg gelan-s --batch 64 --methods conv,conv+silu,inductor,cudnn
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from yolov9.core.model import DetectionModel

METHODS = ("conv", "conv+silu", "inductor", "triton", "cudnn")


def silu_convs(model: DetectionModel, batch: int, img: int) -> Counter:
    """(Cin, H, W, weight shape, stride, padding, groups) of every conv that a SiLU follows, with its count."""
    shapes: Counter = Counter()

    def hook(mod, inp, _out):
        conv = mod.conv
        x = inp[0]
        shapes[
            (x.shape[1], x.shape[2], x.shape[3], tuple(conv.weight.shape), conv.stride, conv.padding, conv.groups)
        ] += 1

    blocks = [m for m in model.modules() if isinstance(getattr(m, "act", None), nn.SiLU) and hasattr(m, "conv")]
    handles = [m.register_forward_hook(hook) for m in blocks]
    with torch.no_grad():
        model(torch.zeros(1, 3, img, img))
    for h in handles:
        h.remove()
    return shapes


REPS = 10  # calls per timed replay


def timed(fn, x: torch.Tensor, iters: int, graphed: bool) -> float:
    """Milliseconds per call: the median over `iters` replays of REPS calls (one CUDA graph when `graphed`)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture wants
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(side)
    if graphed:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(REPS):
                fn(x)
        run = graph.replay
    else:
        run = lambda: [fn(x) for _ in range(REPS)]  # noqa: E731
    run()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / REPS)
    return statistics.median(times)


def cudnn_fused(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, stride, padding):
    import cudnn  # noqa: PLC0415 (nvidia-cudnn-frontend, optional)

    half = cudnn.data_type.HALF
    handle = cudnn.create_handle()  # its own, set to torch's stream at each call (so it can be captured)
    graph = cudnn.pygraph(
        io_data_type=half,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )
    bias = b.reshape(1, -1, 1, 1).contiguous(memory_format=torch.channels_last)
    tx = graph.tensor(name="X", dim=x.size(), stride=x.stride(), data_type=half)
    tw = graph.tensor(name="W", dim=w.size(), stride=w.stride(), data_type=half)
    tb = graph.tensor(name="B", dim=bias.size(), stride=bias.stride(), data_type=half)
    y = graph.conv_fprop(image=tx, weight=tw, padding=list(padding), stride=list(stride), dilation=[1, 1])
    y = graph.bias(name="bias", input=y, bias=tb)
    y = graph.swish(name="silu", input=y) if hasattr(graph, "swish") else graph.mul(a=y, b=graph.sigmoid(input=y))
    want = F.silu(F.conv2d(x, w, b, stride, padding))
    out = torch.empty_like(want)  # the graph's output buffer: want's shape and layout, none of its values
    y.set_output(True)
    y.set_dim(list(out.shape))
    y.set_stride(list(out.stride()))
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    ws = torch.empty(graph.get_workspace_size(), device=x.device, dtype=torch.uint8)

    def run(inp: torch.Tensor) -> torch.Tensor:
        cudnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
        graph.execute({tx: inp, tw: w, tb: bias, y: out}, ws, handle=handle)
        return out

    run(x)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
    return run


def method_fn(name: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, stride, padding, groups: int):
    plain = lambda t: F.silu(F.conv2d(t, w, b, stride, padding, 1, groups))  # noqa: E731
    if name == "conv":
        return lambda t: F.conv2d(t, w, b, stride, padding, 1, groups)
    if name == "conv+silu":
        return plain
    if name == "inductor":
        torch._dynamo.reset()
        return torch.compile(plain)
    if name == "triton":
        torch._dynamo.reset()
        opts = {"max_autotune": True, "max_autotune_conv_backends": "TRITON"}
        return torch.compile(plain, options=opts)
    if name == "cudnn":
        return cudnn_fused(x, w, b, stride, padding) if groups == 1 else None
    raise SystemExit(f"unknown method {name!r}; choose from {', '.join(METHODS)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cfg", default="gelan-s", help="model config")
    ap.add_argument("--batch", type=int, default=64, help="batch size")
    ap.add_argument("--img", type=int, default=640, help="image size")
    ap.add_argument("--methods", default="conv,conv+silu,inductor,cudnn", help=f"comma-separated, of {METHODS}")
    ap.add_argument("--max-shapes", type=int, default=0, help="only the N shapes with the largest inputs (0: all)")
    ap.add_argument("--iters", type=int, default=50, help="timed replays per shape and method")
    ap.add_argument("--no-graph", action="store_true", help="launch the calls back to back instead of one CUDA graph")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    torch.backends.cudnn.benchmark = True
    model = DetectionModel(args.cfg).deploy()
    shapes = sorted(silu_convs(model, args.batch, args.img).items(), key=lambda kv: -kv[0][0] * kv[0][1] * kv[0][2])
    shapes = shapes[: args.max_shapes] if args.max_shapes else shapes
    totals: Counter = Counter()
    for (cin, h, w_, wshape, stride, padding, groups), count in shapes:
        dev = {"device": "cuda", "dtype": torch.float16}
        x = torch.randn(args.batch, cin, h, w_, **dev).contiguous(memory_format=torch.channels_last)
        weight = torch.randn(wshape, **dev).contiguous(memory_format=torch.channels_last) * 0.05
        bias = torch.randn(wshape[0], **dev)
        row = {"in": [args.batch, cin, h, w_], "weight": list(wshape), "stride": stride, "groups": groups, "n": count}
        for name in args.methods.split(","):
            try:
                fn = method_fn(name, x, weight, bias, stride, padding, groups)
                ms = timed(fn, x, args.iters, not args.no_graph) if fn is not None else None
            except Exception as e:  # a method that cannot run this shape: say why, keep going
                row[f"{name}_error"] = f"{type(e).__name__}: {e}"[:200]
                continue
            row[name] = None if ms is None else round(ms, 4)
            if ms is not None:
                totals[name] += ms * count
        print(json.dumps(row), flush=True)
    print(json.dumps({"cfg": args.cfg, "batch": args.batch, "shapes": len(shapes), "total_ms": dict(totals)}))


if __name__ == "__main__":
    main()
