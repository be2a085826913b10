"""The interpreter's switch interval while one of the trainer's threads does interpreter-bound work beside the
training thread (a background compile's tracing and code generation; the warm-up's data thread importing and
caching). CPython's default is 5 ms: the training thread gives up the interpreter lock in the C++ part of every
operation, queue read and pinned copy, and waits up to the interval to win it back from such a thread."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

SHORT_SWITCH_INTERVAL_S = 2e-4


@contextmanager
def switch_interval(seconds: float = SHORT_SWITCH_INTERVAL_S) -> Iterator[None]:
    """CPython's thread switch interval set to `seconds` inside the block (it is process-wide), then restored."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)
