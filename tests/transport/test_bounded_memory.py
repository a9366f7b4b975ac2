"""Large values cost their size and no more (issue 38 §1).

The rule a sender keeps: the receiver gets what was passed to ``call()`` (or
returned by an endpoint) even if the sender changes it right after. Below
``send_snapshot_max`` the sender keeps that promise with a snapshot and goes on
at once; above it, with no copy: the send returns once the bytes have left its
memory. Snapshots of all peers together stay within ``staging_max``.

Peak memory is each process's ``VmHWM`` (``/proc/<pid>/status``), reset before
each measurement (``clear_refs``): what a transfer costs beyond the values
themselves must stay within ``staging_max``. The procs live on this host (the
one-sided offload path) and on a worker on loopback (the TCP path). In
``tests/transport``, after ``tests/multihost``: a loopback worker attached
first would make this client advertise 127.0.0.1, which the lab's hosts
cannot reach.
"""

from __future__ import annotations

import concurrent.futures
import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import danaus
from danaus._runtime.node import this_node
from danaus._wire import memory
from danaus.actor import Actor, ActorMesh, HostMesh, endpoint, this_host
from danaus.config import configured
from danaus.rdma import RDMABuffer
from loopback_worker import REPLY_TIMEOUT, loopback_worker

MiB = 1 << 20
GiB = 1 << 30
BIG_TIMEOUT = 120.0  # a 1 GiB value on a loaded 2-core machine


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/self/status")


def reset_peak() -> int:
    """Forget this process's peak resident size; its resident size now.

    Once it has settled: the kernel takes a while (~0.1 s) to unmap a GiB that was
    just freed, and a peak reset meanwhile would count those pages as still held."""
    gc.collect()
    before = _status("VmRSS")
    for _ in range(200):  # 2 s at most
        time.sleep(0.01)
        now = _status("VmRSS")
        if abs(now - before) < (1 << 20):
            break
        before = now
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS")


def peak() -> int:
    return _status("VmHWM")


def bound() -> int:
    """What a process may hold beyond the values: the staging budget."""
    return int(danaus.config.get_global_config()["staging_max"])


class Big(Actor):
    def __init__(self) -> None:
        self.kept: Any = None
        self.rdma: Any = None

    @endpoint
    def configure(self, **settings: Any) -> None:
        danaus.config.configure(**settings)  # this proc's own settings

    @endpoint
    def reset_peak(self) -> int:
        return reset_peak()

    @endpoint
    def peak(self) -> int:
        return peak()

    @endpoint
    def marks(self, a: Any) -> tuple[int, int, int, int]:
        """The size and three bytes of what arrived (first, middle, last)."""
        v = memoryview(a).cast("B")
        return v.nbytes, v[0], v[v.nbytes // 2], v[-1]

    @endpoint
    def make(self, n: int, fill: int) -> Any:
        return np.full(n, fill, dtype=np.uint8)

    @endpoint
    def get(self) -> Any:
        return self.kept

    @endpoint
    def keep(self, n: int) -> None:
        self.kept = np.zeros(n, dtype=np.uint8)

    @endpoint
    def bump(self) -> None:
        self.kept += 1

    @endpoint
    def register(self, n: int, fill: int) -> RDMABuffer:
        self.kept = np.full(n, fill, dtype=np.uint8)
        self.rdma = RDMABuffer(self.kept)
        return self.rdma

    @endpoint
    def kept_marks(self) -> tuple[int, int, int, int]:
        v = memoryview(self.kept).cast("B")
        return v.nbytes, v[0], v[v.nbytes // 2], v[-1]

    @endpoint
    def drop(self) -> None:
        if self.rdma is not None:
            self.rdma.drop().get(timeout=REPLY_TIMEOUT)
        self.kept = self.rdma = None


@pytest.fixture(scope="module")
def local() -> Iterator[ActorMesh[Big]]:
    procs = this_host().spawn_procs(per_host={"x": 4})
    mesh = procs.spawn("big", Big)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    yield mesh
    procs.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def remote_host() -> Iterator[HostMesh]:
    with loopback_worker() as hm:
        yield hm


@pytest.fixture(scope="module")
def remote(remote_host: HostMesh) -> ActorMesh[Big]:
    procs = remote_host.spawn_procs(per_host={"x": 2})
    mesh = procs.spawn("rbig", Big)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    return mesh  # stopped by the host mesh's shutdown


@pytest.fixture(params=["local", "remote"])
def where(request: pytest.FixtureRequest) -> ActorMesh[Big]:
    mesh: ActorMesh[Big] = request.getfixturevalue(request.param)
    return mesh


def _proc(mesh: ActorMesh[Big]) -> str:
    """The name of the proc of a one-actor mesh."""
    [proc] = danaus.stats(mesh).get(timeout=REPLY_TIMEOUT).procs
    return str(proc.proc)


# -- the rule, both sides of send_snapshot_max ------------------------------------------


@pytest.mark.timeout(120)
def test_below_send_snapshot_max_a_change_right_after_call_is_not_seen(where) -> None:
    one = where.slice(x=0)
    n = 16 * MiB  # below the default 64 MiB: a snapshot, and call() returns at once
    arr = np.zeros(n, dtype=np.uint8)
    staging = memory.staging
    staging.peak = staging.used
    fut = one.marks.call_one(arr)
    arr += 7
    assert fut.get(timeout=REPLY_TIMEOUT) == (n, 0, 0, 0)
    assert staging.peak >= n  # the send took a snapshot's budget ...
    assert staging.used == 0 or staging.used < n  # ... and gave it back


@pytest.mark.timeout(120)
def test_above_send_snapshot_max_call_returns_once_the_bytes_left_and_copies_nothing(
    where,
) -> None:
    one = where.slice(x=0)
    proc = _proc(one)
    rt = this_node().runtime
    n = 16 * MiB
    arr = np.zeros(n, dtype=np.uint8)
    staging = memory.staging
    with configured(send_snapshot_max=8 * MiB):
        staging.peak = staging.used
        fut = one.marks.call_one(arr)
        # call_one has returned: no byte of the value waits in this process any more
        # (the receiver read it, or the kernel has it), and none was copied.
        assert rt.outbound_bytes(proc) < n
        assert staging.peak < n
        arr += 7
    assert fut.get(timeout=REPLY_TIMEOUT) == (n, 0, 0, 0)
    # Sent again, changed: the receiver sees exactly this one.
    assert one.marks.call_one(arr).get(timeout=REPLY_TIMEOUT) == (n, 7, 7, 7)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("limit", ["snapshot", "lent"])
def test_a_large_result_is_what_the_actor_returned_even_if_it_changes_it_right_after(
    where, limit: str
) -> None:
    one = where.slice(x=0)
    n = 16 * MiB
    # The actor's reply is sent by its proc: the proc's own setting decides.
    one.configure.call_one(send_snapshot_max=64 * MiB if limit == "snapshot" else 8 * MiB).get(
        timeout=REPLY_TIMEOUT
    )
    try:
        one.keep.call_one(n).get(timeout=REPLY_TIMEOUT)
        futures = []
        for _ in range(6):
            futures.append(one.get.call_one())
            one.bump.broadcast()
        for step, f in enumerate(futures):
            arr = f.get(timeout=REPLY_TIMEOUT)
            assert int(arr.min()) == int(arr.max()) == step  # never torn, never a later step
    finally:
        one.configure.call_one(send_snapshot_max=64 * MiB).get(timeout=REPLY_TIMEOUT)
        one.drop.call_one().get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(180)
def test_snapshots_of_many_concurrent_messages_stay_within_staging_max(local) -> None:
    """16 messages of 8 MiB from 8 threads at once, with room for 3 snapshots: the
    others are lent (their senders wait), and every receiver sees what was passed."""
    n, senders, limit = 8 * MiB, 8, 3 * 8 * MiB
    staging = memory.staging
    start = threading.Barrier(senders)

    def send(i: int) -> list[tuple[int, int, int, int]]:
        one = local.slice(x=i % 3)
        arr = np.full(n, i, dtype=np.uint8)
        start.wait(REPLY_TIMEOUT)
        futs = []
        for _ in range(2):
            futs.append(one.marks.call_one(arr))
            arr += 100  # right after the call: must not show in what was sent
            arr -= 100
        return [f.get(timeout=REPLY_TIMEOUT) for f in futs]

    with configured(staging_max=limit):
        staging.peak = staging.used
        with concurrent.futures.ThreadPoolExecutor(senders) as pool:
            results = list(pool.map(send, range(senders)))
        assert staging.peak <= limit
    for i, got in enumerate(results):
        assert got == [(n, i, i, i)] * 2


# -- peak memory with several 1 GiB values at once --------------------------------------

# Two 1 GiB values at once in the default run; four (8 GiB in all, more than 20 s on a
# loaded 2-core machine) with -m slow.
COUNTS = [2, pytest.param(4, marks=pytest.mark.slow)]


def _peaks(mesh: ActorMesh[Big]) -> tuple[int, list[int]]:
    """Reset the peaks of this process and of every actor's proc; their sizes now."""
    base = [int(v) for v in mesh.reset_peak.call().get(timeout=REPLY_TIMEOUT).values()]
    return reset_peak(), base


def _extra(mesh: ActorMesh[Big], base: list[int]) -> list[int]:
    peaks = [int(v) for v in mesh.peak.call().get(timeout=REPLY_TIMEOUT).values()]
    return [p - b for p, b in zip(peaks, base, strict=True)]


def _send_each(mesh: ActorMesh[Big], values: list[Any]) -> list[Any]:
    """``values[i]`` to the actor of rank ``i``, all at once (a thread each); the marks."""

    def send(i: int) -> Any:
        return mesh.slice(x=i).marks.call_one(values[i]).get(timeout=BIG_TIMEOUT)

    with concurrent.futures.ThreadPoolExecutor(len(values)) as pool:
        return list(pool.map(send, range(len(values))))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("k", COUNTS)
def test_several_1gib_arguments_at_once_cost_the_receivers_their_size_and_the_sender_nothing(
    local, k: int
) -> None:
    values = [np.full(GiB, i + 1, dtype=np.uint8) for i in range(k)]
    mesh = local.slice(x=slice(0, k))
    me, base = _peaks(mesh)
    got = _send_each(local, values)
    assert got == [(GiB, i + 1, i + 1, i + 1) for i in range(k)]
    assert peak() - me <= bound(), "the sender copied what it sent"
    for extra in _extra(mesh, base):
        assert extra <= GiB + bound()
    del values


@pytest.mark.timeout(300)
@pytest.mark.parametrize("k", COUNTS)
def test_several_1gib_results_at_once_cost_their_size_on_both_sides(local, k: int) -> None:
    mesh = local.slice(x=slice(0, k))
    me, base = _peaks(mesh)
    results = mesh.make.call(GiB, 5).get(timeout=BIG_TIMEOUT)
    values = list(results.values())
    assert len(values) == k
    for v in values:
        assert v.nbytes == GiB and (v[0], v[GiB // 2], v[-1]) == (5, 5, 5)
    assert peak() - me <= k * GiB + bound()
    del results, values
    for extra in _extra(mesh, base):
        assert extra <= GiB + bound()  # the value it made, not another copy of it


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "where, k",
    [
        ("local", 2),
        ("remote", 1),
        pytest.param("local", 4, marks=pytest.mark.slow),
        pytest.param("remote", 2, marks=pytest.mark.slow),
    ],
)
def test_several_1gib_transfers_at_once_cost_no_memory_beyond_the_buffers(
    request: pytest.FixtureRequest, where: str, k: int
) -> None:
    """Every owner's 1 GiB buffer read into the client, then written from it, all at once
    (on this host: process_vm; on the loopback worker: streamed over TCP in chunks)."""
    mesh = request.getfixturevalue(where).slice(x=slice(0, k))
    bufs = list(mesh.register.call(GiB, 9).get(timeout=BIG_TIMEOUT).values())
    k = len(bufs)
    local = [np.full(GiB, 1, dtype=np.uint8) for _ in range(k)]  # resident before
    try:
        me, base = _peaks(mesh)
        reads = [b.read_into(d, timeout=BIG_TIMEOUT) for b, d in zip(bufs, local, strict=True)]
        for f in reads:
            f.get(timeout=BIG_TIMEOUT)
        for d in local:
            assert (d[0], d[GiB // 2], d[-1]) == (9, 9, 9)
            d += 1
        writes = [b.write_from(s, timeout=BIG_TIMEOUT) for b, s in zip(bufs, local, strict=True)]
        for f in writes:
            f.get(timeout=BIG_TIMEOUT)
        assert peak() - me <= bound()
        for extra in _extra(mesh, base):
            assert extra <= bound()
        marks = mesh.kept_marks.call().get(timeout=REPLY_TIMEOUT).values()
        assert list(marks) == [(GiB, 10, 10, 10)] * k
    finally:
        mesh.drop.call().get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(300)
def test_1gib_values_over_tcp_cost_their_size_on_both_sides(remote) -> None:
    k = 2
    values = [np.full(GiB, i + 1, dtype=np.uint8) for i in range(k)]
    me, base = _peaks(remote)
    got = _send_each(remote, values)
    assert got == [(GiB, i + 1, i + 1, i + 1) for i in range(k)]
    assert peak() - me <= bound(), "the sender copied what it sent"
    for extra in _extra(remote, base):
        assert extra <= GiB + bound()
    del values
    me, base = _peaks(remote)
    results = list(remote.make.call(GiB, 6).get(timeout=BIG_TIMEOUT).values())
    assert [(r[0], r[-1]) for r in results] == [(6, 6)] * k
    assert peak() - me <= k * GiB + bound()
    del results
    for extra in _extra(remote, base):
        assert extra <= GiB + bound()
