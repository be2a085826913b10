"""The second process of a background compile (`python -m yolov9.train.cache_fill_worker SPEC`, started by
cache_fill.CacheFill): compiles the part the spec describes (compiled.fill_caches) and prints its counts as the last
line, or why it could not."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

NICE = 10  # the compile takes the cores the training's loader and step leave
MEMORY_RESERVE = 0.1  # of the GPU's memory, kept free for the training process (its validation, a new capture)


def _exit_with_parent() -> None:
    """Exit when the training process is gone (killed before it could stop this one)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _limit_memory(device: torch.device) -> None:
    """Run out of memory here rather than make the training process run out: take at most what is free now, less
    MEMORY_RESERVE of the whole."""
    import torch

    torch.cuda.set_device(device)
    free, total = torch.cuda.mem_get_info(device)
    torch.cuda.set_per_process_memory_fraction(max(free - MEMORY_RESERVE * total, 0.0) / total, device)


def main(argv: list[str] | None = None) -> int:
    (spec_path,) = sys.argv[1:] if argv is None else argv
    _exit_with_parent()
    with contextlib.suppress(OSError):
        os.nice(NICE)
    # imported once the watch runs: on a loaded machine these imports take many seconds, and a parent that died
    # meanwhile went unnoticed until they ended (the orphan test failed beside a second test run on two cores)
    import torch

    from yolov9.train.compiled import fill_caches, first_cause

    try:
        spec = torch.load(spec_path, weights_only=True)
        device = torch.device(spec["device"])
        if device.type == "cuda":
            _limit_memory(device)
        report = fill_caches(spec, device)
    except Exception as e:  # the last line is the reason the training process reports
        print(first_cause(e), flush=True)
        return 1
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
