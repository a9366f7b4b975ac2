"""The cast tree at scale, on a simulated mesh (in-process procs on one thread).

A simulated proc is a real runtime (peers, ports, tree router, mailboxes)
over the in-process transport, so these casts run the same forwarding and
gathering code as real procs; only sizes that real procs cannot reach on
this machine are tested here.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from danaus._actor.tools.simulated import SimulatedMesh
from danaus._mesh.tree import depth
from danaus._runtime.node import this_node
from danaus.actor import Actor, SupervisionError, endpoint
from danaus.testing import wait_until

from .conftest import TIMEOUT


class Recorder(Actor):
    def __init__(self) -> None:
        self.got: dict[str, list[int]] = {}

    @endpoint
    def add(self, sender: str, i: int) -> None:
        self.got.setdefault(sender, []).append(i)

    @endpoint
    def count(self) -> int:
        return sum(len(v) for v in self.got.values())


@pytest.mark.timeout(900)
def test_4096_simulated_ranks_each_get_every_cast_of_two_senders_once_in_order(
    settings: Any,
) -> None:
    settings(tree_fanout=16)
    casts = 100
    with SimulatedMesh(Recorder, {"hosts": 256, "gpus": 16}) as sim:
        other = sim.sender()
        rt = this_node().runtime
        sent_before = rt.tree.stats.forwarded

        def second() -> None:
            for i in range(casts):
                other.broadcast("add", "B", i)

        t = threading.Thread(target=second)
        t.start()
        for i in range(casts):
            sim.mesh.add.broadcast("A", i)
        t.join()
        # FIFO per sender: this call is behind the client's 100 casts on every path.
        counts = sim.mesh.count.call().get(timeout=600)
        assert min(counts.values()) >= casts
        assert rt.tree.stats.forwarded - sent_before <= 16 * (casts + 1)  # O(fan-out) each

        def everyone_has_all() -> bool:
            return all(c.instance.count() == 2 * casts for c in sim.cells)

        wait_until(lambda: sim.on_loop(everyone_has_all), 600, "every cell has every cast")
        expected = list(range(casts))
        bad = sim.on_loop(
            lambda: [
                r
                for r, c in enumerate(sim.cells)
                if c.instance.got.get("A") != expected or c.instance.got.get("B") != expected
            ]
        )
        assert bad == []
        # Each proc received each cast exactly once (plus the one gathered call).
        received = sim.on_loop(lambda: {r.tree.stats.casts for r in sim.runtimes})
        assert received == {2 * casts + 1}
        assert sim.on_loop(lambda: max(r.tree.stats.max_hops for r in sim.runtimes)) == depth(
            4096, 16
        )


def test_a_simulated_proc_killed_fails_its_subtree_and_later_casts_go_around_it(
    settings: Any,
) -> None:
    settings(tree_fanout=4)
    with SimulatedMesh(Recorder, {"gpus": 64}) as sim:
        m = sim.mesh
        assert set(m.count.call().get(timeout=TIMEOUT).values()) == {0}
        # rank 16 heads [16, 32): its subtree is 16..31 (fan-out 4)
        sim.kill(16)
        with pytest.raises(SupervisionError, match=r"sim\[16\]"):
            m.count.call().get(timeout=TIMEOUT)
        below = m.slice(gpus=slice(17, 32))
        assert list(below.count.call().get(timeout=TIMEOUT).values()) == [0] * 15
        m.slice(gpus=slice(17, 64)).add.broadcast("X", 1)
        assert m.slice(gpus=31).count.call_one().get(timeout=TIMEOUT) == 1
