"""Ending a client's node releases everything it holds (issue 25 §1).

One client process uses every subsystem that keeps state on its node (RDMA
buffers and a transfer, in-process listeners, the unhandled-fault hook, the
dashboard, a job, a coalescing block on a tensor mesh, a trace), ends its node
with ``shutdown_context()``, starts a second node in the same process and
checks that none of the first node's state is visible there. The scenario
runs in a client process of its own: ending the node of the test process
would end it under every other test's meshes. The per-subsystem details are
tested beside each subsystem (``tests/rdma/test_node_end.py``,
``tests/supervision/test_node_end.py``, ``tests/tensor/test_lifecycle.py``,
``tests/integration/test_lifecycle.py``).
"""

from __future__ import annotations

import json

import pytest

SCRIPT = """
import json
import os
import socket

import torch

import danaus
import danaus.actor
from danaus import _config
from danaus._actor.core.owned import Registry
from danaus._observe import dashboard, logtail
from danaus._rdma import net
from danaus._rdma.registry import BufferRegistry
from danaus._runtime import node
from danaus._supervision.hook import Faults
from danaus._tensor import coalescing
from danaus._tensor.client import ClientState
from danaus.actor import Actor, endpoint, shutdown_context, this_host
from danaus.job import LocalJob
from danaus.rdma import RDMABuffer
from danaus.testing import FaultRecorder, SimulatedMesh


class Worker(Actor):
    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def boom(self):
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
trace_path = "trace.json"  # in the script's directory

# -- the first node: every subsystem used --------------------------------------------
job = LocalJob(("hosts",))
hosts = job.state().hosts  # a job: its mesh is this session's this_host()
procs = hosts.spawn_procs(per_host={"gpu": 2})
workers = procs.spawn("w", Worker)
with danaus.trace(trace_path):  # a trace: the runtime's tracer while it runs
    workers.echo.call(1).get(timeout=30)
workers.boom.broadcast()  # the fault hook's thread
recorder.crashed("w", {0, 1}, timeout=30)
data = bytearray(b"x" * 4096)
buf = RDMABuffer(data)  # RDMA: a registration, a lease, the copy threads
got = bytearray(4096)
buf.read_into(got).get(timeout=30)
sim = SimulatedMesh(Worker, {"ranks": 2})  # in-process listeners
sim.mesh.echo.call(2).get(timeout=30)
logtail.append("p-first", "a line of the first node")
with procs.activate():  # the tensor engine, and a coalescing block left open
    t = torch.ones(2) * 3
block = danaus.coalescing()
block.__enter__()

first = node.this_node(start=False)
first_rt = first.runtime
first_names = [first_rt.proc_id.name] + [rt.proc_id.name for rt in sim.runtimes]
memory = first.part(BufferRegistry)
before = {
    "copied": got == data,
    "registered": len(memory.registered_buffers()),
    "fault_thread": first.part(Faults).thread is not None,
    "dashboard": not refuses(first.part(dashboard.FromEnvironment).dashboard),
    "trace_written": os.path.getsize(trace_path) > 0,
    "tracer_off": first_rt.tracer is None,
    "coalescing": coalescing.active(),
    "listening": all(first_rt.transport.inproc.is_listening(n) for n in first_names),
    "owned_procs": len(first.part(Registry).proc_meshes) > 0,
    "log_procs": logtail.procs(first),
}
first_thread = first.part(Faults).thread
first_dash = first.part(dashboard.FromEnvironment).dashboard

shutdown_context().get(timeout=60)

ended = {
    "current_is_none": node.this_node(start=False) is None,
    "registered": len(memory.registered_buffers()),
    "idle": first.part(net.DataClient).idle_connections(),
    "fault_thread_alive": first_thread.is_alive(),
    "dashboard_stopped": refuses(first_dash),
    "transport_closed": first_rt.transport.inproc.closed,
}

# -- a second node in the same process: nothing of the first is visible -----------------
second_hosts = LocalJob(("hosts",)).state().hosts
again = second_hosts.spawn_procs(per_host={"gpu": 1})
value = again.spawn("w2", Worker).echo.call_one(3).get(timeout=30)
second = node.this_node(start=False)
rt = second.runtime
state = second.part(ClientState)
fresh = {
    "new_node": second is not None and second is not first,
    "value": value,
    "new_host_mesh": second_hosts is not hosts,
    "registered": len(second.part(BufferRegistry).registered_buffers()),
    "idle": second.part(net.DataClient).idle_connections(),
    "fault_thread": second.part(Faults).thread is None,
    "dashboard_new": second.part(dashboard.FromEnvironment).dashboard not in (None, first_dash),
    "tracer_off": rt.tracer is None,
    "listening": [rt.transport.inproc.is_listening(n) for n in first_names],
    "active_meshes": len(state.stack),
    "coalescing": coalescing.active(),
    "owned_proc_meshes": len(second.part(Registry).proc_meshes),
    "log_procs": logtail.procs(second),
}
block.__exit__(None, None, None)  # ends on the ended node's state, harmlessly
sim.close()
print(json.dumps({"before": before, "ended": ended, "fresh": fresh}))
shutdown_context().get(timeout=60)
"""


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_a_second_node_sees_nothing_of_an_ended_node_that_used_every_subsystem(
    client_script,
) -> None:
    result = client_script.run(SCRIPT, timeout=150)
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["before"] == {
        "copied": True,
        "registered": 1,
        "fault_thread": True,
        "dashboard": True,
        "trace_written": True,
        "tracer_off": True,
        "coalescing": True,
        "listening": True,
        "owned_procs": True,
        "log_procs": ["p-first"],
    }
    assert out["ended"] == {
        "current_is_none": True,
        "registered": 0,
        "idle": 0,
        "fault_thread_alive": False,
        "dashboard_stopped": True,
        "transport_closed": True,
    }
    fresh = out["fresh"]
    assert fresh == {
        "new_node": True,
        "value": 3,
        "new_host_mesh": True,
        "registered": 0,
        "idle": 0,
        "fault_thread": True,
        "dashboard_new": True,
        "tracer_off": True,
        "listening": [False] * len(fresh["listening"]),
        "active_meshes": 0,
        "coalescing": False,
        "owned_proc_meshes": 1,
        "log_procs": [],
    }
    assert len(fresh["listening"]) == 3  # the first client and its two simulated procs
