"""Each layer's forward and backward, eager against compiled one layer at a time (`--compile layers`), on the inputs
a real forward gives it (issue "Trainer throughput": where the compiled step's GPU time goes, layer by layer).
Under autocast, channels-last, in training mode; each layer is timed alone (synchronised) over --iters calls after
--warmup. `--pool` changes how the SPPELAN blocks' max pooling runs inside a compiled region: 'inductor'
(inductor's max_pool2d lowering), 'eager' (a graph break: aten's kernel), 'separable' (the model's
`max_pool_same`: a max of shifted slices, rows then columns; as trained). Prints one JSON line per layer and a total:

    python docs/scripts/layer_times.py --cfg yolov9-s --batch 128 --pool separable [--layers 9,29] [--types SPPELAN]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.utils._pytree import tree_leaves, tree_map

from yolov9.core import modules
from yolov9.core.model import DetectionModel, run_layers
from yolov9.train.step import to_input


def set_pool(kind: str) -> None:
    """'separable' is the model's own choice when compiled for training (core/modules.py, max_pool_same)."""
    plain = lambda self, x: self.m(x)  # noqa: E731
    if kind == "inductor":
        modules.SP.forward = plain
    elif kind == "eager":
        modules.SP.forward = torch.compiler.disable(plain)


def layer_inputs(model: DetectionModel, x: torch.Tensor) -> list:
    """Each layer's input(s) from one forward, detached, requiring grad where they did."""
    seen: list = []

    def record(m):
        def call(inp):
            seen.append(tree_map(lambda t: t.detach().requires_grad_(t.requires_grad), inp))
            return m(inp)

        return call

    run_layers(model.model, [record(m) for m in model.model], model.save, x)
    return seen


def time_layer(call, inp, iters: int, warmup: int) -> float:
    """ms per forward and backward of `call` on `inp`, with a fixed random gradient for each output."""
    out = call(inp)
    grads = [torch.randn_like(t) for t in tree_leaves(out) if t.requires_grad]
    leaves = [t for t in tree_leaves(inp) if t.requires_grad]
    params = [p for p in call.parameters()] if isinstance(call, torch.nn.Module) else []

    def step():
        outs = [t for t in tree_leaves(call(inp)) if t.requires_grad]
        torch.autograd.backward(outs, grads)
        for t in leaves + params:
            t.grad = None

    for _ in range(warmup):
        step()
    sync()
    t = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    return (time.perf_counter() - t) * 1e3 / iters


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cfg", default="yolov9-s")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--img", type=int, default=640)
    ap.add_argument("--pool", choices=("inductor", "eager", "separable"), default="separable")
    ap.add_argument("--layers", default="", help="comma-separated layer indices (default: all)")
    ap.add_argument("--types", default="", help="comma-separated layer types, e.g. SPPELAN,ADown (default: all)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    set_pool(a.pool)
    torch.backends.cudnn.benchmark = True
    dev = torch.device(a.device)
    model = DetectionModel(a.cfg, nc=80).to(dev).train().to(memory_format=torch.channels_last)
    imgs = torch.randint(0, 255, (a.batch, 3, a.img, a.img), dtype=torch.uint8, device=dev)
    imgs = imgs.contiguous(memory_format=torch.channels_last)
    wanted = {int(i) for i in a.layers.split(",") if i}
    types = {t for t in a.types.split(",") if t}
    totals = {"eager_ms": 0.0, "compiled_ms": 0.0, "compile_s": 0.0}
    with torch.autocast(dev.type, dtype=torch.float16 if dev.type == "cuda" else torch.bfloat16):
        inputs = layer_inputs(model, to_input(imgs))
        for m, inp in zip(model.model, inputs):
            if (wanted and m.i not in wanted) or (types and type(m).__name__ not in types):
                continue
            row = {"layer": m.i, "type": type(m).__name__, "in": [list(t.shape) for t in tree_leaves(inp)]}
            row["eager_ms"] = time_layer(m, inp, a.iters, a.warmup)
            compiled = torch.compile(m, dynamic=False)
            t = time.perf_counter()
            time_layer(compiled, inp, 1, 0)
            row["compile_s"] = time.perf_counter() - t
            row["compiled_ms"] = time_layer(compiled, inp, a.iters, a.warmup)
            for k in totals:
                totals[k] += row[k]
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    summary = {"cfg": a.cfg, "batch": a.batch, "pool": a.pool, **{k: round(v, 2) for k, v in totals.items()}}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
