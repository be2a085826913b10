"""torch.distributed for training: one process per GPU (NCCL) or per CPU slot (gloo), started by torchrun or by
`yolov9 train --device 0,1` (which runs torchrun's launcher). Rank 0 writes logs, plots and checkpoints; every
rank trains on its share of each global batch.

A collective that waits longer than $YOLOV9_DIST_TIMEOUT_S (default 1800 s) fails that rank; torchrun then stops
the others, so a dead or stuck rank ends the run instead of hanging it."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from yolov9.core.device import select_device


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    device: torch.device = torch.device("cpu")
    active: bool = False  # a process group exists (under torchrun, even with one rank)

    @property
    def main(self) -> bool:
        return self.rank == 0


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(device: str) -> DistContext:
    """The process's place in the run: from torchrun's environment variables, else a single process."""
    if not under_torchrun():
        return DistContext(device=select_device(device))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if device == "cpu" or not torch.cuda.is_available():
        dev, backend = torch.device("cpu"), "gloo"
    else:  # one GPU per local rank, among those the launcher made visible
        dev, backend = torch.device(f"cuda:{local_rank}"), "nccl"
        torch.cuda.set_device(dev)
    timeout = timedelta(seconds=float(os.environ.get("YOLOV9_DIST_TIMEOUT_S", 1800)))
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timeout, device_id=dev if backend == "nccl" else None)
    return DistContext(rank, world, local_rank, local_world, dev, active=True)


def barrier(ctx: DistContext) -> None:
    if ctx.active:
        dist.barrier()


def mean(ctx: DistContext, t: torch.Tensor) -> torch.Tensor:
    """The mean over ranks (a copy; the input is left as it is)."""
    if not ctx.active:
        return t
    t = t.detach().clone()
    dist.all_reduce(t)
    return t / ctx.world


def spread(ctx: DistContext, value: float) -> float:
    """max - min of a float over ranks (0.0 when ranks agree, as their parameters must)."""
    if not ctx.active:
        return 0.0
    t = torch.tensor([value, -value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0] + t[1])


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def launch(devices: list[str], argv: list[str]) -> int:
    """`yolov9 train --device 0,1,...`: the same command, once per listed GPU, through torchrun's launcher on this
    machine (rendezvous on a free local port). Returns the launcher's exit code."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={len(devices)}"]
    cmd += ["-m", "yolov9", *argv]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(devices)}
    return subprocess.call(cmd, env=env)


def with_device(argv: list[str], device: str) -> list[str]:
    """argv with its --device value replaced (each rank takes its own GPU)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--device":
            skip = True
            continue
        if a.startswith("--device="):
            continue
        out.append(a)
    return [*out, "--device", device]
