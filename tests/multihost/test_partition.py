"""Network partitions: a host cut off by setting its veth down.

A partition longer than the heartbeat timeout (2 s here) fails the cut-off
host: calls to its ranks raise ``SupervisionError`` and its owner gets a
``MeshFailure`` per rank, while other hosts keep answering. A shorter one is
invisible: TCP retransmits once the link is back, and every message sent
during the outage arrives, once and in order.

Each test partitions a host of its own (its own namespace and worker), so the
shared hosts stay healthy for the rest of the session.
"""

from __future__ import annotations

import time

import pytest

from danaus.actor import SupervisionError

from .conftest import HEARTBEAT_TIMEOUT, TIMEOUT, Probe


@pytest.fixture
def two_hosts(net, fresh_worker, attach_fresh):
    """``(host mesh, partitionable host)``: a shared host's namespace, and one of our own."""
    steady, cut = fresh_worker(net[0]), fresh_worker()
    hm = attach_fresh([steady, cut])
    cut.host.worker = cut
    yield hm, cut.host
    cut.host.heal()


def test_a_partition_longer_than_the_heartbeat_fails_the_host_and_spares_others(
    two_hosts, faults
) -> None:
    hm, cut = two_hosts
    pm = hm.spawn_procs(per_host={"gpus": 2})
    probes = pm.spawn("cut_off", Probe)
    assert list(probes.echo.call(0).get(timeout=TIMEOUT).values()) == [0] * 4

    start = time.monotonic()
    cut.partition()
    during = probes.slice(hosts=1).echo.call(1)
    # The other host answers throughout.
    assert list(probes.slice(hosts=0).echo.call(2).get(timeout=TIMEOUT).values()) == [2, 2]
    with pytest.raises(SupervisionError):
        during.get(timeout=TIMEOUT)
    detected = time.monotonic() - start
    assert HEARTBEAT_TIMEOUT - 0.5 < detected < 3 * HEARTBEAT_TIMEOUT, detected
    failures = faults.crashed("cut_off", {2, 3})
    # The procs are alive, just unreachable: the reason must say so, not "exited".
    reasons = [f.reason for f in failures]
    assert all("heartbeat" in r and "exited" not in r for r in reasons), reasons

    with pytest.raises(SupervisionError):
        probes.slice(hosts=1, gpus=0).echo.call_one(3).get(timeout=TIMEOUT)
    assert list(probes.slice(hosts=0).echo.call(4).get(timeout=TIMEOUT).values()) == [4, 4]
    cut.heal()
    # A lost proc stays lost, even once the network is back.
    with pytest.raises(SupervisionError):
        probes.slice(hosts=1, gpus=1).echo.call_one(5).get(timeout=TIMEOUT)
    assert list(probes.slice(hosts=0).echo.call(6).get(timeout=TIMEOUT).values()) == [6, 6]


# Well inside the heartbeat timeout, TCP's retransmission backoff included: a
# segment lost at the start of the outage is resent after 0.2, 0.6, 1.4, 3.0 s
# (Linux's 200 ms minimum RTO, doubling), so a 0.5 s outage is over by the
# second resend and the peer hears from us again ~0.6 s after the cut.
SHORT_OUTAGE = 0.5


def test_a_short_partition_loses_and_reorders_nothing(two_hosts, faults) -> None:
    hm, cut = two_hosts
    pm = hm.spawn_procs(per_host={"gpus": 2})
    probes = pm.spawn("patient", Probe)
    assert list(probes.echo.call(0).get(timeout=TIMEOUT).values()) == [0] * 4
    far = probes.slice(hosts=1)

    cut.partition()
    start = time.monotonic()
    calls = []
    for seq in range(50):
        if seq % 2:
            far.record.broadcast(seq)
        else:
            calls.append((seq, far.record.call(seq)))
    sent = time.monotonic() - start
    time.sleep(SHORT_OUTAGE - sent)  # the deliberate outage
    cut.heal()

    for seq, fut in calls:
        assert list(fut.get(timeout=TIMEOUT).values()) == [seq, seq]
    assert list(far.recorded.call().get(timeout=TIMEOUT).values()) == [list(range(50))] * 2
    assert sent < SHORT_OUTAGE  # they were all sent during the outage
    assert list(probes.echo.call(1).get(timeout=TIMEOUT).values()) == [1] * 4
    assert faults.unseen() == []


def test_after_a_partition_heals_the_client_can_attach_to_that_worker_again(
    two_hosts, attach_fresh, faults
) -> None:
    hm, cut = two_hosts
    pm = hm.slice(hosts=1).spawn_procs(per_host={"gpus": 1})
    probes = pm.spawn("lost_once", Probe)
    assert probes.echo.call_one(0).get(timeout=TIMEOUT) == 0
    cut.partition()
    faults.crashed("lost_once", {0}, timeout=3 * HEARTBEAT_TIMEOUT)
    cut.heal()
    # The worker dropped the client it lost (and killed its procs); it takes a
    # client again, this one included.
    again = attach_fresh([cut.worker], timeout=10.0)  # attaching takes well under 1 s
    fresh = again.spawn_procs(per_host={"gpus": 1}).spawn("found_again", Probe)
    assert fresh.facts.call_one().get(timeout=TIMEOUT).netns_inode == cut.netns_inode
    # Stop them now: the first host mesh's teardown shuts this worker down, which
    # (rightly) reads as a failure of any of this client's procs still running there.
    again.stop().get(timeout=TIMEOUT)
