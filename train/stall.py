"""A stalled loop says where it waits: while a loop of `watched` waits for or works on one item longer than
STALL_S, every thread's Python stack is printed to stderr (faulthandler's `dump_traceback_later`, from a C thread,
so a hang that holds the interpreter lock is reported too), once per item, under `Timeout (h:mm:ss)!`. The
training epochs and validation loop through it. $YOLOV9_STALL_S sets the limit (default 900 s; 0 turns it off)."""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

STALL_S = float(os.environ.get("YOLOV9_STALL_S", 900))  # the default: longer than a cold compile's first step


def watched(items: Iterable[T]) -> Iterator[T]:
    """`items`, with the report armed while each is awaited and used: its clock restarts as the next is asked for,
    and it is disarmed when the loop ends or is left."""
    it = iter(items)
    try:
        while True:
            if STALL_S > 0 and sys.__stderr__ is not None:
                faulthandler.dump_traceback_later(STALL_S, file=sys.__stderr__)
            try:
                item = next(it)
            except StopIteration:
                return
            yield item
    finally:
        faulthandler.cancel_dump_traceback_later()
