"""Ending the client's node releases the fault hook's thread, the log tails and the
dashboard ``DANAUS_DASHBOARD=1`` started; the next node in the process starts afresh."""

from __future__ import annotations

import json

import pytest

from .conftest import ClientScript

SCRIPT = """
import json
import socket
import danaus.actor
from danaus import _config
from danaus._observe import dashboard, logtail
from danaus._runtime import node
from danaus._supervision.hook import Faults
from danaus.actor import Actor, endpoint, shutdown_context, this_host
from danaus.testing import FaultRecorder

class Worker(Actor):
    @endpoint
    def boom(self) -> None:
        raise ValueError("nobody handles this boom")

recorder = FaultRecorder()
danaus.actor.unhandled_fault_hook = recorder
_config.configure(dashboard=True)  # DANAUS_DASHBOARD=1: served at the first spawn


def refuses(dash):  # True once nothing listens at the dashboard's address any more
    try:
        socket.create_connection((dash.host, dash.port), timeout=30).close()
    except ConnectionRefusedError:
        return True
    return False

def session(name):
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    procs.spawn(name, Worker).boom.broadcast()
    recorder.crashed(name, {0}, timeout=30)
    n = node.this_node(start=False)
    return n, procs, n.part(Faults).thread, n.part(dashboard.FromEnvironment).dashboard

first, procs, first_thread, first_dash = session("first")
logtail.append("p-first", "a line of the first session")
before = {
    "thread_alive": first_thread is not None and first_thread.is_alive(),
    "dash": first_dash is not None and not refuses(first_dash),
    "procs": logtail.procs(first),
}
shutdown_context().get(timeout=30)
ended = {
    "thread_alive": first_thread.is_alive(),
    "dash_stopped": refuses(first_dash),
    "current": node.this_node(start=False),
}

# The next use starts a second node in this process.
second = this_host().spawn_procs(per_host={"gpus": 1})
second.initialized.get(timeout=30)
n = node.this_node(start=False)
fresh = {
    "new_node": n is not first and n is not None,
    "thread": n.part(Faults).thread,
    "dash_is_new": n.part(dashboard.FromEnvironment).dashboard not in (None, first_dash),
    "procs": logtail.procs(n),
    "tail": logtail.tail(n, "p-first"),
}
second.spawn("second", Worker).boom.broadcast()
recorder.crashed("second", {0}, timeout=30)
second_thread = n.part(Faults).thread
print(json.dumps({
    "before": before,
    "ended": {**ended, "current": ended["current"] is None},
    "fresh": {**fresh, "thread": fresh["thread"] is None},
    "second_thread": second_thread is not None and second_thread is not first_thread
    and second_thread.is_alive(),
}))
shutdown_context().get(timeout=30)
print("SECOND_THREAD_ALIVE", second_thread.is_alive())
"""


@pytest.mark.timeout(120)
def test_a_new_node_sees_nothing_of_the_ended_ones_hook_thread_log_tails_and_dashboard(
    client_script: ClientScript,
) -> None:
    result = client_script.run(SCRIPT, timeout=100)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    out = json.loads(lines[-2])
    assert out["before"] == {"thread_alive": True, "dash": True, "procs": ["p-first"]}
    # Ending the node ended its hook thread (quietly) and stopped its dashboard.
    assert out["ended"] == {"thread_alive": False, "dash_stopped": True, "current": True}
    # The second node has no hook thread until its first failure, a dashboard of its
    # own, and none of the first's log lines.
    assert out["fresh"] == {
        "new_node": True,
        "thread": True,
        "dash_is_new": True,
        "procs": [],
        "tail": [],
    }
    assert out["second_thread"] is True
    assert lines[-1] == "SECOND_THREAD_ALIVE False"
    assert result.stderr.count("danaus dashboard: http://") == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
