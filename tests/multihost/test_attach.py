"""Attaching to workers on several hosts, spawning across them, and calling across hosts.

Every host is a network namespace (see ``conftest.py``); an actor proves where
it runs by the inode of its network namespace, which the kernel fixes per
namespace, and by the TCP address its proc advertises.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import danaus.config
from danaus._runtime.node import this_node
from danaus.actor import Actor, ActorMesh, endpoint, this_host
from danaus.testing import wait_until

from .conftest import TIMEOUT, Facts, Probe, where_am_i


def test_attach_to_workers_gives_a_host_mesh_of_one_host_per_worker(hosts, net) -> None:
    assert hosts.sizes == {"hosts": len(net)}
    assert [h.sizes for h in (hosts.slice(hosts=i) for i in range(len(net)))] == [{}] * len(net)


def test_spawn_procs_places_procs_row_major_each_in_its_hosts_namespace(procs, net) -> None:
    assert procs.sizes == {"hosts": len(net), "gpus": 2}
    probes = procs.spawn("where", Probe)
    facts = probes.facts.call().get(timeout=TIMEOUT)
    seen = []
    for point, f in facts.items():
        host = net[point["hosts"]]
        assert f.rank == point.rank == point["hosts"] * 2 + point["gpus"]
        assert f.coords == {"hosts": point["hosts"], "gpus": point["gpus"]}
        assert f.netns_inode == host.netns_inode, f"rank {f.rank} is not in {host.netns}"
        assert f.tcp.startswith(f"tcp://{host.ip}:"), f.tcp
        seen.append((point["hosts"], point["gpus"]))
    assert seen == [(h, g) for h in range(len(net)) for g in range(2)]
    assert len({f.pid for f in facts.values()}) == 2 * len(net)  # one process per proc


def test_calls_and_slices_reach_exactly_the_addressed_hosts(procs, net) -> None:
    probes = procs.spawn("echoes", Probe)
    everyone = probes.echo.call("hi").get(timeout=TIMEOUT)
    assert list(everyone.values()) == ["hi"] * (2 * len(net))

    host1 = probes.slice(hosts=1)
    assert host1.sizes == {"gpus": 2}
    facts = host1.facts.call().get(timeout=TIMEOUT)
    assert [f.netns_inode for f in facts.values()] == [net[1].netns_inode] * 2
    assert [f.rank for f in facts.values()] == [2, 3]  # ranks in the whole mesh
    assert [f.message_coords for f in facts.values()] == [{"gpus": 0}, {"gpus": 1}]

    one = probes.slice(hosts=2, gpus=1).facts.call_one().get(timeout=TIMEOUT)
    assert (one.netns_inode, one.rank) == (net[2].netns_inode, 5)
    assert probes.slice(hosts=0).echo.choose(7).get(timeout=TIMEOUT) == 7
    streamed = sorted(f.get(timeout=TIMEOUT).rank for f in probes.slice(gpus=0).facts.stream())
    assert streamed == [0, 2, 4]


class Relay(Actor):
    """Calls a mesh it was handed, from wherever it runs."""

    @endpoint
    def call_mesh(self, mesh: ActorMesh[Probe]) -> tuple[Facts, list[Facts]]:
        return where_am_i(), list(mesh.facts.call().get(timeout=TIMEOUT).values())


def test_a_mesh_passed_to_an_actor_on_another_host_is_called_from_there(procs, net) -> None:
    targets = procs.slice(hosts=2).spawn("targets", Probe)
    relays = procs.slice(hosts=0).spawn("relays", Relay)
    # Only messages from the spawner are ordered after the spawn: a mesh handed to
    # a third party must exist before that party calls it.
    targets.initialized.get(timeout=TIMEOUT)
    me, answers = relays.slice(gpus=1).call_mesh.call_one(targets).get(timeout=TIMEOUT)
    assert me.netns_inode == net[0].netns_inode
    assert [a.netns_inode for a in answers] == [net[2].netns_inode] * 2
    assert [a.message_coords for a in answers] == [{"gpus": 0}, {"gpus": 1}]
    # And every relay, on every host, can call a mesh that spans all hosts.
    everywhere = procs.spawn("everywhere", Probe)
    all_relays = procs.spawn("all_relays", Relay)
    everywhere.initialized.get(timeout=TIMEOUT)
    for _, (_me, got) in all_relays.call_mesh.call(everywhere).get(timeout=TIMEOUT).items():
        assert [g.netns_inode for g in got] == [h.netns_inode for h in net for _ in range(2)]


class Spawner(Actor):
    """Spawns procs on ``this_host()`` from inside an actor."""

    def __init__(self) -> None:
        self.inner: Any = None

    @endpoint
    def spawn_here(self) -> tuple[Facts, list[Facts], ActorMesh[Probe]]:
        pm = this_host().spawn_procs(per_host={"gpus": 2})
        pm.initialized.get(timeout=TIMEOUT)
        self.inner = pm.spawn("inner", Probe)
        inner = list(self.inner.facts.call().get(timeout=TIMEOUT).values())
        return where_am_i(), inner, self.inner


def test_this_host_inside_an_actor_is_the_host_it_runs_on(procs, net) -> None:
    spawner = procs.slice(hosts=1, gpus=0).spawn("spawner", Spawner)
    me, inner, mesh = spawner.spawn_here.call_one().get(timeout=TIMEOUT)
    assert me.netns_inode == net[1].netns_inode
    assert [f.netns_inode for f in inner] == [net[1].netns_inode] * 2
    assert len({f.pid for f in inner} | {me.pid}) == 3  # new processes
    # The mesh those procs carry is usable from the client too, across hosts, so
    # they must be reachable over TCP like every proc on a worker host.
    assert [f.tcp.partition(":")[0] for f in inner] == ["tcp"] * 2, inner
    again = mesh.facts.call().get(timeout=TIMEOUT)
    assert [f.netns_inode for f in again.values()] == [net[1].netns_inode] * 2


class TreeProbe(Probe):
    @endpoint
    def forwarded(self) -> int:
        """Subtrees this actor's proc has sent a cast down to (the cast tree's hops)."""
        return this_node().runtime.tree.stats.forwarded


def test_a_cast_tree_across_hosts_reaches_every_proc_at_its_tcp_address(procs, net) -> None:
    # Meshes of tree_min_ranks (64) procs or more are messaged through the cast tree,
    # whose procs dial each other from the routes the caller sends. Those routes held
    # the address each proc had before its READY (a Unix path on the caller's host), so
    # on several hosts a forwarding proc could not reach its children (issue 44: 64
    # procs on 8 hosts failed). A small tree here: the same path, every proc forwarding.
    with danaus.config.configured(tree_min_ranks=2, tree_fanout=2):
        probes = procs.spawn("tree_probes", TreeProbe)
        facts = probes.facts.call().get(timeout=TIMEOUT)
        assert this_node().runtime.tree.use_tree(probes._ref.mesh_id, probes._ref.procs)
        for point, f in facts.items():
            assert f.netns_inode == net[point["hosts"]].netns_inode, (point.rank, f)
        assert sorted(f.rank for f in facts.values()) == list(range(2 * len(net)))
        hops = probes.forwarded.call().get(timeout=TIMEOUT)
        assert sum(hops.values()) > 0  # procs forwarded to procs (on other hosts)


def _sockets(pid: int) -> int:
    """How many sockets process ``pid`` holds open."""
    fds = Path(f"/proc/{pid}/fd")
    return sum(1 for fd in fds.iterdir() if os.readlink(fd).startswith("socket:"))


def test_attaching_again_to_a_worker_opens_no_second_connection(fresh_worker, attach_fresh) -> None:
    """A client that attaches to a worker it is attached to already (a host that came
    back, as the fault campaign does) reuses its connection: before, each attach left
    one more connection open, on both sides, for as long as both ran."""
    worker = fresh_worker()
    first = attach_fresh([worker])
    pm = first.spawn_procs(per_host={"gpus": 1})
    assert pm.spawn("first", Probe).echo.call_one(1).get(timeout=TIMEOUT) == 1
    pm.stop().get(timeout=TIMEOUT)
    held = _sockets(worker.proc.pid)
    for k in range(3):
        again = attach_fresh([worker])
        probe = again.spawn_procs(per_host={"gpus": 1}).spawn(f"again{k}", Probe)
        assert probe.echo.call_one(k).get(timeout=TIMEOUT) == k
        again.stop().get(timeout=TIMEOUT)
        assert _sockets(worker.proc.pid) == held, f"attach {k + 2}"


def test_a_worker_attached_twice_and_lost_leaves_no_connection_held(
    fresh_worker, attach_fresh
) -> None:
    """Attached twice (a host that came back), then the host is gone: every name the
    connections served is lost with them (the provisional names of both attaches too),
    and none of them keeps its closed connection (the soak's client grew by one per
    host loss). In tests/multihost: a test attaching the test process to a loopback
    worker would fix the address it advertises for the rest of the run."""
    rt = this_node().runtime
    worker = fresh_worker()
    first = attach_fresh([worker])
    again = attach_fresh([worker])  # as a host that came back
    for hm in (first, again):
        assert hm.initialized.get(timeout=TIMEOUT) is True
    (agent,) = again._agents()
    assert agent is not None
    worker.kill()  # the host is gone
    wait_until(lambda: rt.peers.is_lost(agent.name), TIMEOUT, "the worker to be lost")
    with rt.peers.lock:
        holding = [
            name
            for name, p in rt.peers.table.items()
            if p.lost is not None and (p.conn or p.link or p.dialing or p.waiting)
        ]
        stale = [
            n
            for n, p in rt.peers.table.items()
            if p.lost is None and any(c is not None and c.closed for c in (p.conn, p.link))
        ]
    assert holding == [] and stale == []
