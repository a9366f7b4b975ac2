"""What the client holds after meshes are spawned and stopped: nothing more than before.

Issue 44's soak spawned and stopped a mesh every second or so for 30 minutes,
and the client's RSS grew 8 MiB a minute: the ``HostMesh`` kept every
``ProcMesh`` spawned through it after ``stop()``, and the peer table kept each
stopped proc's closed ``Connection`` (two 128 KiB decoder buffers each). These
tests count the registries, not bytes: after N spawns and stops each is back
at its size before them. Losing a worker host that was attached twice (the
soak attaches a host again when it comes back) left a closed connection held
under the second attach's provisional name, never marked lost.
"""

from __future__ import annotations

import gc
import os
from typing import Any

from danaus._actor.api.procs import owned_proc_meshes
from danaus._actor.core import owned
from danaus._runtime.node import this_node
from danaus._transport.conn.connection import Connection
from danaus.actor import Actor, endpoint, this_host
from danaus.testing import wait_until

from .conftest import REPLY_TIMEOUT

ROUNDS = 4


class Probe(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _connections() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Connection))


def _held() -> dict[str, Any]:
    """The sizes of what the client keeps per mesh and per proc."""
    registry = this_node().part(owned.Registry)
    with registry.lock:
        actor_meshes = len(registry.actor_meshes)
        proc_meshes = sum(len(v) for v in registry.proc_meshes.values())
    return {
        "this_host().proc_meshes": len(this_host()._state.proc_meshes),
        "owned_proc_meshes()": len(owned_proc_meshes()),
        "owned actor meshes": actor_meshes,
        "owned proc meshes": proc_meshes,
    }


def _lost_peers_holding_a_connection() -> list[str]:
    rt = this_node().runtime
    with rt.peers.lock:
        return [
            name
            for name, p in rt.peers.table.items()
            if p.lost is not None and (p.conn or p.link or p.dialing or p.waiting)
        ]


def _spawn_call_stop() -> str:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    probe: Any = pm.spawn("probe", Probe)
    assert len(probe.pid.call().get(timeout=REPLY_TIMEOUT)) == 2
    pm.stop().get(timeout=REPLY_TIMEOUT)
    return pm._procs[0].name


def test_spawning_and_stopping_meshes_leaves_the_registries_as_they_were() -> None:
    _spawn_call_stop()  # the first spawn starts the host agent, the registry actor ...
    before = _held()
    conns = _connections()
    names = [_spawn_call_stop() for _ in range(ROUNDS)]
    assert _held() == before
    # A stopped proc stays known as lost (a late message to it fails at once, saying
    # why), but without its connection.
    rt = this_node().runtime
    assert all(rt.peers.is_lost(n) for n in names), [(n, rt.peers.is_lost(n)) for n in names]
    assert _lost_peers_holding_a_connection() == []
    # Closed connections go once the liveness ticker forgets them (one heartbeat).
    wait_until(_connections, REPLY_TIMEOUT, f"{conns} connections", until=lambda n: n <= conns)


def test_a_host_mesh_lets_go_of_a_stopped_mesh_and_keeps_the_live_ones() -> None:
    hm = this_host()
    stopped = hm.spawn_procs(per_host={"gpus": 1})
    live = hm.spawn_procs(per_host={"gpus": 1})
    probes: Any = live.spawn("probe", Probe)
    probes.pid.call_one().get(timeout=REPLY_TIMEOUT)
    stopped.stop().get(timeout=REPLY_TIMEOUT)
    held = [pm._state for pm in hm._state.proc_meshes]
    assert not any(s is stopped._state for s in held) and any(s is live._state for s in held)
    live.stop().get(timeout=REPLY_TIMEOUT)
    assert not any(pm._state is live._state for pm in hm._state.proc_meshes)
