"""Stopping a server's process group: nothing of it outlives stop()."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.conftest import alive
from yolov9.core.processes import ManagedProcess

# a child that ignores the stop signal (as a Triton model's stub can outlive the server) and writes its pid, under
# a leader that exits at the stop signal
_CHILD = "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(os.getpid(), flush=True); "
_CHILD += "time.sleep(300)"
_LEADER = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[2]], stdout=open(sys.argv[1], "w"))
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
time.sleep(300)
"""


class _Server(ManagedProcess):
    stop_timeout = 5.0

    def start(self, pid_file) -> _Server:
        self.proc = subprocess.Popen([sys.executable, "-c", _LEADER, str(pid_file), _CHILD], start_new_session=True)
        return self


def test_stop_leaves_no_process_of_the_group_behind(tmp_path):
    pid_file = tmp_path / "child.pid"
    server = _Server().start(pid_file)
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    server.stop()
    assert not server.running()
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the child that ignored the stop signal outlived stop()"
