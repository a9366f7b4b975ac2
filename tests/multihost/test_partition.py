"""Network partitions: a host cut off by setting its veth down.

A partition longer than the heartbeat timeout (2 s here) fails the cut-off
host: calls to its ranks raise ``SupervisionError`` and its owner gets a
``MeshFailure`` per rank, while other hosts keep answering. On its side the
worker, cut off from its client as long, kills the procs it ran for it
(fenced): nothing of them acts when the link returns, and the host rejoins only
as a fresh one (attached again, a spare for a supervisor). A shorter one is
invisible: TCP retransmits once the link is back, and every message sent
during the outage arrives, once and in order.

Each test partitions a host of its own (its own namespace and worker), so the
shared hosts stay healthy for the rest of the session.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from danaus import _netlab_workers
from danaus.actor import Actor, SupervisionError, endpoint
from danaus.supervisor import Supervisor
from danaus.testing import wait_until

from .conftest import HEARTBEAT_TIMEOUT, TIMEOUT, Probe, wait_pids_gone


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
    # Attached again, and again (as a spare for a supervisor, say): the later attaches
    # share the first one's connection, not one more each for the session (issue 44).
    more = attach_fresh([cut.worker], timeout=10.0)
    assert (
        more.spawn_procs(per_host={"gpus": 1})
        .spawn("again", Probe)
        .echo.call_one(5)
        .get(timeout=TIMEOUT)
        == 5
    )
    assert _connections_to(cut.worker.address) == 1
    more.stop().get(timeout=TIMEOUT)
    # Stop them now: the first host mesh's teardown shuts this worker down, which
    # (rightly) reads as a failure of any of this client's procs still running there.
    again.stop().get(timeout=TIMEOUT)


def _connections_to(address: str) -> int:
    """This process's established TCP connections to ``tcp://IP:PORT``."""
    ip, port = address.removeprefix("tcp://").rsplit(":", 1)
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[len("socket:[") : -1])
    want = "{:08X}:{:04X}".format(
        int.from_bytes(bytes(map(int, ip.split("."))), "little"), int(port)
    )
    n = 0
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[2] == want and f[3] == "01" and f[9] in mine:  # ESTABLISHED, ours
            n += 1
    return n


# -- fencing: a cut-off worker stops its actors, so nothing acts twice --------------


class Ticker(Actor):
    """Acts on the world on its own: appends a line to ``path`` every 20 ms."""

    def __init__(self, path: str) -> None:
        self.path = path
        threading.Thread(target=self._tick, daemon=True).start()

    def _tick(self) -> None:
        n = 0
        while True:
            with open(self.path, "a") as f:
                f.write(f"{os.getpid()} {n}\n")
            n += 1
            time.sleep(0.02)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _facts_or_none(mesh):
    """The rank's facts; ``None`` while the call fails (sent before a restart was seen)."""
    try:
        return mesh.facts.call_one().get(timeout=TIMEOUT)
    except SupervisionError:
        return None


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_worker_cut_off_longer_than_its_liveness_limit_stops_its_actors(
    two_hosts, faults, tmp_path
) -> None:
    """The worker judges its client lost after its own ``heartbeat_timeout`` (2 s here,
    up to twice that for a client whose frames came irregularly) and kills the procs
    it ran for it while still cut off: when the link returns nothing of them acts."""
    hm, cut = two_hosts
    out = tmp_path / "ticks"
    tickers = hm.slice(hosts=1).spawn_procs(per_host={"gpus": 2}).spawn("fenced", Ticker, str(out))
    pids = list(tickers.pid.call().get(timeout=TIMEOUT).values())
    wait_until(lambda: _lines(out), TIMEOUT, "the tickers to write")

    cut.partition()
    start = time.monotonic()
    # Gone while the link is still down: fenced by their own worker, not by the client.
    assert wait_pids_gone(pids, timeout=4 * HEARTBEAT_TIMEOUT) == []
    fenced_after = time.monotonic() - start
    assert fenced_after < 4 * HEARTBEAT_TIMEOUT, fenced_after
    faults.crashed("fenced", {0, 1})
    written = _lines(out)
    cut.heal()
    # Back on the network: the old actors do not resume (they are gone), their calls
    # fail, and nothing more is written on their behalf.
    with pytest.raises(SupervisionError):
        tickers.pid.call().get(timeout=TIMEOUT)
    time.sleep(0.2)  # several tick periods: a surviving ticker would have written
    assert _lines(out) == written
    assert all(int(line.split()[0]) in pids for line in out.read_text().splitlines())


def test_a_host_back_from_a_partition_rejoins_as_a_spare_and_resumes_nothing(
    net, fresh_worker, attach_fresh, faults, tmp_path
) -> None:
    """Its ranks move to the spare host while it is cut off; once back and attached
    again it takes ranks as a spare host, as new actors (nothing of before)."""
    steady, cut, spare = fresh_worker(net[0]), fresh_worker(), fresh_worker()
    hosts = attach_fresh([steady, cut])
    spares = attach_fresh([spare])
    sup = Supervisor(strategy="one_for_one", max_restarts=5, spare_hosts=spares)
    try:
        probes = sup.spawn(hosts.spawn_procs(per_host={"gpus": 1}), "rejoin", Probe)
        probes.slice(hosts=1).record.call(1).get(timeout=TIMEOUT)
        old = probes.facts.call().get(timeout=TIMEOUT).item(hosts=1)

        cut.host.partition()
        assert wait_pids_gone([old.pid], timeout=4 * HEARTBEAT_TIMEOUT) == []  # fenced
        moved = wait_until(
            lambda: _facts_or_none(probes.slice(hosts=1)),
            TIMEOUT,
            "rank 1 restarted on the spare host",
            until=lambda f: f is not None and f.netns_inode == spare.host.netns_inode,
        )
        assert moved.rank == 1 and moved.pid != old.pid
        cut.host.heal()

        # Back: attached again, handed to the supervisor as its spare host.
        sup.spare_hosts = attach_fresh([cut], timeout=10.0)
        spare.kill()
        back = wait_until(
            lambda: _facts_or_none(probes.slice(hosts=1)),
            TIMEOUT,
            "rank 1 restarted on the host that came back",
            until=lambda f: f is not None and f.netns_inode == cut.host.netns_inode,
        )
        assert back.pid not in (old.pid, moved.pid)
        # A new actor: what the old one recorded before the partition is not there.
        assert probes.slice(hosts=1).recorded.call_one().get(timeout=TIMEOUT) == []
        assert probes.slice(hosts=0).recorded.call_one().get(timeout=TIMEOUT) == []
    finally:
        sup.stop()


def test_a_spawn_the_worker_reads_as_it_loses_its_client_leaves_no_proc_behind(
    fresh_worker, attach_fresh, faults
) -> None:
    """The worker frozen (SIGSTOP) while the client asks it for a proc and then, having
    judged it lost, closes the connection: thawed, the worker reads the ask and the
    close at once, forks the proc and ends the client's session, in that order. A proc
    forked after the session ended used to run on, idle, for the worker's lifetime (the
    fault campaign's leftover procs, issue 44); it is killed as soon as it is forked."""
    w = fresh_worker()
    hm = attach_fresh([w])
    frozen = _netlab_workers.host_pids(w.host)  # the worker and its zygote
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        pm = hm.spawn_procs(per_host={"gpus": 1}, name="never")
        with pytest.raises(Exception):  # noqa: B017 - lost: the kind matters not here
            pm.initialized.get(timeout=6 * HEARTBEAT_TIMEOUT)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    # Attached again, a proc of the new session: the zygote forks in order, so once
    # this one is up the one asked before the loss was forked too.
    again = attach_fresh([w], timeout=10.0)
    probe = again.spawn_procs(per_host={"gpus": 1}).spawn("after", Probe)
    keep = {*frozen, probe.facts.call_one().get(timeout=TIMEOUT).pid}
    wait_until(
        lambda: [p for p in _netlab_workers.host_pids(w.host) if p not in keep],
        TIMEOUT,
        "the proc forked for the lost client to be gone",
        until=lambda left: left == [],
    )
    again.stop().get(timeout=TIMEOUT)
    faults.mark_seen()  # the client heard its mesh was lost: that is the point
