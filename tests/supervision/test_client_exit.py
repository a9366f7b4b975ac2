"""The client's end of supervision, in real client processes (issue 5).

A failure that reaches the client and that nobody handles goes to
``unhandled_fault_hook``; the default one ends the program with exit code 1,
running ``finally`` blocks and at-exit handlers. A hook that raises does the
same and is called once; a hook that returns drops the failure. When a client
dies, even by SIGKILL, its procs go with it — and only its own.
"""

from __future__ import annotations

import os
import signal

from .conftest import TIMEOUT, Lines, pid_alive, wait_pids_gone

ACTOR = """
import os, sys, time, atexit
import danaus.actor
from danaus.actor import Actor, endpoint, this_host

class Worker(Actor):
    @endpoint
    def boom(self) -> None:
        raise ValueError("nobody handles this boom")

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def square(self, x: int) -> int:
        return x * x

def spawn(name):
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    workers = procs.spawn(name, Worker)
    pids = list(workers.pid.call().get(timeout=30).values())
    print("PIDS", *pids, flush=True)
    return procs, workers

def idle():
    while True:  # the client has nothing else to do; an exit interrupts this loop
        time.sleep(0.01)
"""


def parse_pids(text: str) -> list[int]:
    return [int(p) for p in text.split()]


def pids_in(stdout: str) -> list[int]:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("PIDS"))
    return parse_pids(line[len("PIDS") :])


def test_default_hook_exits_with_code_1_after_finally_blocks_and_at_exit_handlers(
    client_script,
) -> None:
    result = client_script.run(
        ACTOR
        + """
atexit.register(lambda: print("AT-EXIT HANDLER RAN", flush=True))
procs, workers = spawn("doomed")
workers.slice(gpus=1).boom.broadcast()
try:
    idle()
finally:
    print("MAIN UNWOUND", flush=True)
print("NOT REACHED", flush=True)
"""
    )
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines.count("AT-EXIT HANDLER RAN") == 1, result.stdout
    assert "MAIN UNWOUND" in lines
    assert "NOT REACHED" not in lines
    assert lines.index("MAIN UNWOUND") < lines.index("AT-EXIT HANDLER RAN")
    assert "MeshFailure" in result.stderr
    assert "doomed" in result.stderr
    assert "nobody handles this boom" in result.stderr
    assert wait_pids_gone(pids_in(result.stdout)) == []


def test_a_raising_hook_is_called_once_and_the_client_exits_with_code_1(client_script) -> None:
    result = client_script.run(
        ACTOR
        + """
def hook(failure):
    print("HOOK CALLED", failure.mesh_name, failure.crashed_ranks, flush=True)
    raise RuntimeError("this hook refuses")

danaus.actor.unhandled_fault_hook = hook
procs, workers = spawn("doomed")
workers.boom.broadcast()  # two failures
idle()
"""
    )
    assert result.returncode == 1, result.stderr
    calls = [ln for ln in result.stdout.splitlines() if ln.startswith("HOOK CALLED")]
    assert len(calls) == 1, result.stdout
    assert calls[0].startswith("HOOK CALLED doomed")
    assert "this hook refuses" in result.stderr
    assert wait_pids_gone(pids_in(result.stdout)) == []


def test_a_hook_that_returns_drops_the_failure_and_the_client_carries_on(client_script) -> None:
    result = client_script.run(
        ACTOR
        + """
import threading
seen = threading.Event()

def hook(failure):
    print("HOOK CALLED", failure.mesh_name, failure.crashed_ranks, flush=True)
    seen.set()

danaus.actor.unhandled_fault_hook = hook
procs, workers = spawn("doomed")
workers.slice(gpus=0).boom.broadcast()
assert seen.wait(30)
print("HEALTHY", workers.slice(gpus=1).square.call_one(7).get(timeout=30), flush=True)
procs.stop().get(timeout=30)
"""
    )
    assert result.returncode == 0, result.stderr
    assert "HOOK CALLED doomed [0]" in result.stdout
    assert "HEALTHY 49" in result.stdout


def test_procs_exit_when_their_client_is_killed_and_other_clients_procs_do_not(
    client_script,
) -> None:
    serve = (
        ACTOR
        + """
procs, workers = spawn("workers")
for line in sys.stdin:  # one request per line, until stdin closes
    x = int(line)
    print("SQUARES", *workers.square.call(x).get(timeout=30).values(), flush=True)
procs.stop().get(timeout=30)
"""
    )
    doomed = client_script.start(serve, name="doomed_client.py")
    survivor = client_script.start(serve, name="surviving_client.py")
    doomed_out, survivor_out = Lines(doomed), Lines(survivor)
    doomed_pids = parse_pids(doomed_out.expect("PIDS"))
    survivor_pids = parse_pids(survivor_out.expect("PIDS"))

    os.kill(doomed.pid, signal.SIGKILL)
    assert doomed.wait(timeout=TIMEOUT) == -signal.SIGKILL
    assert wait_pids_gone(doomed_pids) == []

    assert all(pid_alive(p) for p in survivor_pids)
    assert survivor.stdin is not None
    survivor.stdin.write("9\n")
    survivor.stdin.flush()
    assert survivor_out.expect("SQUARES") == "81 81"
    survivor.stdin.close()
    assert survivor.wait(timeout=TIMEOUT) == 0
    assert wait_pids_gone(survivor_pids) == []


def test_a_main_thread_asleep_in_a_system_call_unwinds_well_within_the_grace(
    client_script,
) -> None:
    # time.sleep blocks in the kernel, where the SystemExit set for the main thread is not
    # seen; the grace is long here, so only the wake-up signal lets the finally run before
    # the run's timeout (without it the process is forced out at the grace's end).
    result = client_script.run(
        ACTOR
        + """
danaus.config.configure(main_exit_grace=600)
atexit.register(lambda: print("AT-EXIT HANDLER RAN", flush=True))
procs, workers = spawn("sleeper")
workers.slice(gpus=1).boom.broadcast()
try:
    time.sleep(3600)
finally:
    print("MAIN UNWOUND", flush=True)
""",
        timeout=TIMEOUT * 3,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert "MAIN UNWOUND" in lines, result.stdout
    assert lines.index("MAIN UNWOUND") < lines.index("AT-EXIT HANDLER RAN")


def test_a_program_that_handles_sigurg_itself_keeps_its_handler(client_script) -> None:
    result = client_script.run(
        ACTOR
        + """
import signal
mine = lambda signum, frame: None
signal.signal(signal.SIGURG, mine)
procs, workers = spawn("polite")
assert workers.slice(gpus=0).square.call_one(3).get(timeout=30) == 9
print("HANDLER KEPT", signal.getsignal(signal.SIGURG) is mine, flush=True)
procs.stop().get(timeout=30)
"""
    )
    assert result.returncode == 0, result.stderr
    assert "HANDLER KEPT True" in result.stdout


def test_a_main_thread_that_will_not_unwind_gets_main_exit_grace_then_danaus_exits_for_it(
    client_script,
) -> None:
    """A main thread that swallows the SystemExit and goes back to sleep does not unwind:
    after ``main_exit_grace`` danaus runs the at-exit handlers and exits with code 1
    itself, without waiting for the sleep (its ``finally`` block never runs), as
    ``docs/troubleshooting.md`` says."""
    result = client_script.run(
        ACTOR
        + """
danaus.config.configure(main_exit_grace=0.5)
atexit.register(lambda: print("AT-EXIT HANDLER RAN", flush=True))
procs, workers = spawn("doomed")
workers.slice(gpus=1).boom.broadcast()
try:
    try:
        time.sleep(3600)
    except SystemExit:
        print("SWALLOWED", flush=True)
        time.sleep(3600)  # the wake-up signal comes once: this sleep is not interrupted
finally:
    print("MAIN UNWOUND", flush=True)
""",
        timeout=TIMEOUT * 3,  # far less than the sleep: danaus did not wait for it
    )
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines.count("AT-EXIT HANDLER RAN") == 1, result.stdout
    assert "SWALLOWED" in lines and "MAIN UNWOUND" not in lines
    assert "nobody handles this boom" in result.stderr
    assert wait_pids_gone(pids_in(result.stdout)) == []
