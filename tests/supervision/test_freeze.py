"""``danaus.testing.freeze``: returns only once every thread of the process is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from danaus.testing import freeze, pid_alive

pytestmark = pytest.mark.timeout(60)

# Three threads, all busy in Python: a stop must reach each of them.
BUSY = """
import threading
def spin():
    while True:
        pass
for _ in range(2):
    threading.Thread(target=spin, daemon=True).start()  # returns once it runs
print("ready", flush=True)
spin()
"""


def _states(pid: int) -> list[str]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as f:
            out.append(f.read().rpartition(")")[2].split()[0])
    return out


def test_freeze_returns_with_every_thread_stopped_and_sigcont_resumes_them() -> None:
    p = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"  # 3 threads run
        freeze(p.pid)
        states = _states(p.pid)
        assert len(states) == 3 and all(s in "tT" for s in states), states
        os.kill(p.pid, signal.SIGCONT)
        assert p.poll() is None and pid_alive(p.pid)
    finally:
        p.kill()
        p.wait(30)
        if p.stdout is not None:
            p.stdout.close()


def test_freeze_of_a_process_that_is_gone_says_so() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(30)
    with pytest.raises(AssertionError, match=f"process {p.pid} is gone"):
        freeze(p.pid)
