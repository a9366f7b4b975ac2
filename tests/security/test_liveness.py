"""A proc on this host that stops answering is lost within the heartbeat timeout.

Its Unix socket never closes and its host agent sees no exit, so only the
heartbeat can tell, and the kernel judges: a SIGSTOPped proc, or one that
neither answers nor runs, is declared lost, and every call pending on it
fails with a clear error; one that runs (holding the GIL for longer than the
timeout, or starved of CPU on a loaded host) is slow, and is not.
"""

from __future__ import annotations

import pytest

from danaus.testing import ClientScript

pytestmark = pytest.mark.timeout(90)

STOPPED = """
import os, signal
os.environ["DANAUS_HEARTBEAT_INTERVAL"] = "0.1"
os.environ["DANAUS_HEARTBEAT_TIMEOUT"] = "1.0"
import danaus.actor
from danaus.actor import Actor, endpoint, this_host
from danaus.testing import freeze

faults = []
danaus.actor.unhandled_fault_hook = faults.append

class Sleeper(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def echo(self, x):
        return x

pm = this_host().spawn_procs(per_host={"gpus": 1})
actor = pm.spawn("sleeper", Sleeper)
pid = actor.pid.call_one().get(timeout=30)
freeze(pid)  # every thread stopped: none can still answer
try:
    pending = actor.echo.call_one("are you there")
    try:
        print("answered", pending.get(timeout=40))
    except Exception as e:
        print("failed", type(e).__name__, "|", e)
finally:
    os.kill(pid, signal.SIGKILL)
"""


def test_a_stopped_proc_on_this_host_is_lost_and_its_pending_call_fails(tmp_path) -> None:
    out = ClientScript(tmp_path).run(STOPPED, timeout=80)
    assert "failed SupervisionError" in out.stdout, (out.stdout, out.stderr[-3000:])
    assert "no heartbeat" in out.stdout and "frozen" in out.stdout, out.stdout


STALLED_CLIENT = """
import threading
import time
import danaus.actor, danaus.config
from danaus._runtime.node import this_node
from danaus.actor import Actor, endpoint, this_host

faults = []
danaus.actor.unhandled_fault_hook = faults.append

class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x

pm = this_host().spawn_procs(per_host={"gpus": 2})
actors = pm.spawn("echo", Echo)
print("before", list(actors.echo.call(1).get(timeout=30).values()), flush=True)
# Only this client gets the short timeout (its procs keep the default 5 s).
danaus.config.configure(heartbeat_interval=0.1, heartbeat_timeout=1.0)
rt = this_node(start=False).runtime
after_stall = threading.Event()

def stall():
    # The client's own I/O loop stalls for 2.5 s (a process starved of CPU or
    # of the GIL): the procs' pings go unread, but the procs are fine.
    time.sleep(2.5)
    # Let several heartbeat ticks (0.1 s apart) judge the silence first.
    rt.loop.call_later(0.5, after_stall.set)

rt.loop.call_soon_threadsafe(stall)
assert after_stall.wait(30), "the client's loop never came back"
print("after", list(actors.echo.call(2).get(timeout=30).values()), flush=True)
print("faults", len(faults), flush=True)
"""


def test_a_stall_of_the_client_s_own_loop_is_not_blamed_on_its_procs(tmp_path) -> None:
    out = ClientScript(tmp_path).run(STALLED_CLIENT, timeout=80)
    assert "before [1, 1]" in out.stdout, (out.stdout, out.stderr[-3000:])
    assert "after [2, 2]" in out.stdout, (out.stdout, out.stderr[-3000:])
    assert "faults 0" in out.stdout, out.stdout


SLOW_OR_STUCK = """
import os, sys, threading, time
os.environ["DANAUS_HEARTBEAT_INTERVAL"] = "0.1"
os.environ["DANAUS_HEARTBEAT_TIMEOUT"] = "1.0"
import danaus.actor
from danaus.actor import Actor, endpoint, this_host

faults = []
lost = threading.Event()

def hook(failure):
    faults.append(failure)
    lost.set()

danaus.actor.unhandled_fault_hook = hook

class Busy(Actor):
    @endpoint
    def hog(self, seconds):
        # Hold the GIL, computing: the proc's I/O thread answers nothing meanwhile.
        sys.setswitchinterval(seconds + 10)
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += 1
        sys.setswitchinterval(0.005)
        return "done"

    @endpoint
    def stick(self):
        # The I/O thread and this actor's thread (which would read its next call
        # itself) block in a sleep: the proc neither answers nor runs.
        from danaus._runtime.node import this_node
        this_node(start=False).runtime.loop.call_soon_threadsafe(time.sleep, 3600)
        time.sleep(3600)

    @endpoint
    def echo(self, x):
        return x

pm = this_host().spawn_procs(per_host={"gpus": 1})
actor = pm.spawn("busy", Busy)
print("hog", actor.hog.call_one(3.0).get(timeout=30), flush=True)
print("echo", actor.echo.call_one(1).get(timeout=30), "faults", len(faults), flush=True)
actor.stick.broadcast()
print("lost", lost.wait(40), "|", faults[0] if faults else None, flush=True)
"""


def test_a_proc_holding_the_gil_past_the_timeout_is_slow_and_one_stuck_asleep_is_lost(
    tmp_path,
) -> None:
    out = ClientScript(tmp_path).run(SLOW_OR_STUCK, timeout=80)
    assert "hog done" in out.stdout, (out.stdout, out.stderr[-3000:])
    assert "echo 1 faults 0" in out.stdout, (out.stdout, out.stderr[-3000:])
    assert "lost True" in out.stdout, (out.stdout, out.stderr[-3000:])
    assert "neither answers nor runs" in out.stdout, out.stdout
