"""Supervision across hosts: a proc or a whole worker dies on one host.

The client learns of it (a ``MeshFailure`` per failed rank, to its
``unhandled_fault_hook``), calls to the failed ranks raise
``SupervisionError`` at once, and the other hosts keep answering.
"""

from __future__ import annotations

import os
import signal

import pytest

from danaus.actor import SupervisionError

from .conftest import TIMEOUT, Probe, wait_pids_gone


@pytest.fixture
def own_procs(hosts):
    """Procs of this test's own on the shared hosts (``{"hosts": 3, "gpus": 2}``)."""
    pm = hosts.spawn_procs(per_host={"gpus": 2})
    assert pm.initialized.get(timeout=TIMEOUT) is True
    yield pm
    pm.stop().get(timeout=TIMEOUT)


def test_a_proc_killed_on_one_host_fails_exactly_its_rank(own_procs, faults) -> None:
    probes = own_procs.spawn("victims", Probe)
    pids = probes.pid.call().get(timeout=TIMEOUT)
    victim = pids.item(hosts=1, gpus=0)
    os.kill(victim, signal.SIGKILL)

    (failure,) = faults.crashed("victims", {2})
    # Which actor failed is certain; how (SIGKILL) only if the remote agent's exit
    # report beats the runtime's short grace for it, so it is not asserted here.
    assert "victims[2]" in failure.reason, failure.reason
    with pytest.raises(SupervisionError) as info:
        probes.slice(hosts=1, gpus=0).echo.call_one(1).get(timeout=TIMEOUT)
    assert "victims[2]" in str(info.value), str(info.value)
    healthy = [probes.slice(hosts=0), probes.slice(hosts=1, gpus=1), probes.slice(hosts=2)]
    for mesh in healthy:
        assert set(mesh.echo.call(3).get(timeout=TIMEOUT).values()) == {3}
    # The very same processes answer: nobody else was restarted or replaced.
    assert probes.slice(hosts=2).pid.call().get(timeout=TIMEOUT) == pids.slice(hosts=2)


def test_killing_a_worker_fails_its_hosts_ranks_and_spares_the_others(
    net, fresh_worker, attach_fresh, faults
) -> None:
    workers = [fresh_worker(net[0]), fresh_worker(net[1])]
    hm = attach_fresh(workers)
    pm = hm.spawn_procs(per_host={"gpus": 2})
    probes = pm.spawn("doomed", Probe)
    pids = probes.pid.call().get(timeout=TIMEOUT)

    workers[1].kill()
    with pytest.raises(SupervisionError) as info:
        probes.slice(hosts=1).echo.call(1).get(timeout=TIMEOUT)
    # Noticed from the closed connections (EOF), not from a heartbeat timeout.
    assert "heartbeat" not in str(info.value), str(info.value)
    faults.crashed("doomed", {2, 3})
    assert wait_pids_gone([pids.item(hosts=1, gpus=g) for g in range(2)]) == []

    assert list(probes.slice(hosts=0).echo.call(2).get(timeout=TIMEOUT).values()) == [2, 2]
    with pytest.raises(SupervisionError):
        probes.echo.call(3).get(timeout=TIMEOUT)  # the whole mesh includes failed ranks
    # The surviving host still spawns.
    more = hm.slice(hosts=0).spawn_procs(per_host={"gpus": 1})
    assert more.spawn("after", Probe).echo.call_one(4).get(timeout=TIMEOUT) == 4
