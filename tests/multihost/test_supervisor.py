"""A supervisor moves the ranks of a host whose worker died to a spare host (issue 27).

The hosts are network namespaces (see ``conftest``): killing a worker kills
its host agent and every proc on it, so its ranks can come back neither in
their procs nor on their host; the supervisor starts them on a host of its
``spare_hosts``.
"""

from __future__ import annotations

from danaus.supervisor import Supervisor
from danaus.testing import wait_until

from .conftest import TIMEOUT, Probe, wait_pids_gone


def test_a_dead_hosts_ranks_come_back_on_the_spare_host(fresh_worker, attach_fresh) -> None:
    doomed, healthy, spare = fresh_worker(), fresh_worker(), fresh_worker()
    hosts = attach_fresh([healthy, doomed])
    spares = attach_fresh([spare])
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    sup = Supervisor(strategy="one_for_one", max_restarts=3, spare_hosts=spares)
    try:
        probes = sup.spawn(procs, "probes", Probe)
        before = probes.facts.call().get(timeout=TIMEOUT)
        doomed_pids = [before.item(hosts=1, gpus=g).pid for g in range(2)]
        probes.slice(hosts=0).record.call(7).get(timeout=TIMEOUT)

        doomed.kill()
        assert wait_pids_gone(doomed_pids) == []
        wait_until(
            lambda: {r for rec in sup.restarts for r in rec.ranks},
            TIMEOUT,
            "ranks 2 and 3 restarted",
            until=lambda ranks: ranks >= {2, 3},
        )
        after = probes.facts.call().get(timeout=TIMEOUT)
        for g in range(2):
            moved = after.item(hosts=1, gpus=g)
            assert moved.netns_inode == spare.host.netns_inode, moved
            assert moved.pid not in doomed_pids
            assert moved.rank == 2 + g  # the same rank, in the same mesh
        # The healthy host's actors were never touched.
        for g in range(2):
            assert after.item(hosts=0, gpus=g).pid == before.item(hosts=0, gpus=g).pid
        assert list(probes.slice(hosts=0).recorded.call().get(timeout=TIMEOUT).values()) == [
            [7],
            [7],
        ]
        assert list(probes.slice(hosts=1).recorded.call().get(timeout=TIMEOUT).values()) == [
            [],
            [],
        ]
    finally:
        sup.stop()
