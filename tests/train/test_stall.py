"""The stall report (train/stall.py): printed for an item that takes too long, once, and never after the loop."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import yolov9.train.stall as stall


def test_a_slow_item_prints_every_threads_stack_once_and_a_left_loop_prints_nothing_more(monkeypatch, capfd):
    monkeypatch.setattr(stall, "STALL_S", 0.05)
    for i in stall.watched(range(3)):
        time.sleep(0.2 if i == 1 else 0.0)  # item 1 stalls: one report, not one per interval
    err = capfd.readouterr().err
    assert err.count("Timeout (0:00:00.05") == 1 and "test_a_slow_item_prints" in err, err
    for _ in stall.watched(range(3)):
        break  # left early: disarmed as the loop is left
    time.sleep(0.2)
    assert capfd.readouterr().err == ""


def test_a_loop_of_quick_items_prints_nothing(monkeypatch, capfd):
    monkeypatch.setattr(stall, "STALL_S", 0.5)
    assert list(stall.watched(x for x in "abc")) == ["a", "b", "c"]
    time.sleep(0.6)
    assert capfd.readouterr().err == ""


def test_the_limit_comes_from_the_environment_and_zero_turns_the_report_off(monkeypatch, capfd):
    code = "import yolov9.train.stall as s; print(s.STALL_S)"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "YOLOV9_STALL_S": "120"}, capture_output=True, text=True
    )
    assert out.stdout.strip() == "120.0", out.stderr[-500:]
    monkeypatch.setattr(stall, "STALL_S", 0.0)
    for _ in stall.watched(range(2)):
        time.sleep(0.1)
    assert capfd.readouterr().err == ""
