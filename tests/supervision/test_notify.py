"""Events the user must hear of reach the terminal, once: a supervisor's restart is
printed to the client's stderr (not only written to ``danaus.log``), in the client and
when the supervisor lives in a proc (whose stderr the client prints, prefixed)."""

from __future__ import annotations

from .conftest import TIMEOUT

CLIENT = """
from danaus.actor import Actor, endpoint, this_host, this_proc
from danaus.supervisor import Supervisor
from danaus.testing import wait_until

class Fragile(Actor):
    @endpoint
    def crash(self) -> None:
        raise RuntimeError("a fault to restart from")

    @endpoint
    def ok(self) -> bool:
        return True

class Owner(Actor):
    @endpoint
    def run(self) -> int:
        sup = Supervisor(strategy="one_for_one", name="in_proc")
        child = sup.spawn(this_proc(), "fragile_in_proc", Fragile)
        child.crash.broadcast()
        wait_until(lambda: sup.restarts, timeout=30, what="a restart")
        return len(sup.restarts)

procs = this_host().spawn_procs(per_host={"gpus": 1})
sup = Supervisor(strategy="one_for_one", name="in_client")
fragile = sup.spawn(procs, "fragile", Fragile)
fragile.crash.broadcast()
wait_until(lambda: sup.restarts, timeout=30, what="a restart")
assert fragile.ok.call_one().get(timeout=30)
print("CLIENT RESTARTS", len(sup.restarts), flush=True)
owner = procs.spawn("owner", Owner)
print("PROC RESTARTS", owner.run.call_one().get(timeout=30), flush=True)
procs.stop().get(timeout=30)
"""


def test_a_restart_reaches_the_terminal_once_from_the_client_and_from_a_proc(
    client_script,
) -> None:
    result = client_script.run(CLIENT, timeout=TIMEOUT * 4)
    assert result.returncode == 0, result.stderr
    assert "CLIENT RESTARTS 1" in result.stdout and "PROC RESTARTS 1" in result.stdout
    lines = result.stderr.splitlines()
    in_client = [ln for ln in lines if "supervisor 'in_client' restarted fragile" in ln]
    in_proc = [ln for ln in lines if "supervisor 'in_proc' restarted fragile_in_proc" in ln]
    assert len(in_client) == 1, result.stderr
    assert "a fault to restart from" in in_client[0]
    assert len(in_proc) == 1, result.stderr
    assert in_proc[0].startswith("[") and "{gpus=0}] " in in_proc[0], in_proc[0]  # from the proc
