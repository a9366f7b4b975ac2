"""A large reply over TCP is received off the I/O loop (issue 11 §2).

The actor's proc lives on a ``danaus worker`` on loopback with a host token of
its own and offloading off, as another machine would be (a worker in this
kernel could otherwise offload, as procs of one host do); its reply frame is
received by a reader thread of its own, straight into its memory, while the
I/O loop serves everyone else. The test freezes the sending proc (SIGSTOP) in
the middle of the frame, so the transfer is certainly under way while other
actors (on the worker and on this host) are called; then lets it go on and
checks the bytes. No peer is declared lost. 64 MiB and 1 GiB.

This module attaches to a loopback worker, so it must run after
``tests/multihost`` (whose hosts cannot reach a loopback address the client
would then advertise): ``transport`` sorts after ``multihost``.
"""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from danaus._runtime.node import this_node
from danaus.actor import HostMesh, ProcMesh, this_host
from danaus.testing import freeze, wait_until
from large_blobs import Blob, check_blob, lost_peers
from loopback_worker import loopback_worker

MiB = 1 << 20
GiB = 1 << 30
REPLY_TIMEOUT = 30.0


def _off_loop() -> int:
    """Bytes this client's reader threads received (large frames, off the I/O loop)."""
    return sum(c.recv_off_loop for c in this_node().runtime.links.all_connections())


@pytest.fixture(scope="module")
def local() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def worker_log(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Where the worker's (and its procs') stderr goes: quoted when a test fails."""
    return tmp_path_factory.mktemp("worker") / "stderr.log"


@pytest.fixture(scope="module")
def remote(worker_log: Any) -> Iterator[HostMesh]:
    """One worker host on loopback: its procs are reached over authenticated TCP."""
    # The worker shares this kernel: without this, large buffers would skip the socket
    # (a one-sided copy, as between procs of one host). This test wants the socket.
    with loopback_worker({"DANAUS_OFFLOAD_MIN": "0"}, stderr=worker_log) as hm:
        yield hm


@pytest.mark.timeout(240)
@pytest.mark.parametrize("size", [64 * MiB, GiB], ids=["64MiB", "1GiB"])
def test_a_large_reply_over_tcp_is_received_off_the_io_loop(
    local, remote, worker_log, size
) -> None:
    rprocs = remote.spawn_procs(per_host={"r": 2})
    far = rprocs.spawn(f"large_tcp_{size}", Blob)
    sender, far_other = far.slice(r=0), far.slice(r=1)
    near = local.spawn(f"large_near_{size}", Blob).slice(gpus=0)
    pid = sender.pid.call_one().get(timeout=REPLY_TIMEOUT)
    assert far_other.echo.call_one(0).get(timeout=REPLY_TIMEOUT) == 0
    lost = lost_peers()
    before = _off_loop()
    big = sender.blob.call_one(size)
    stopped = False
    try:
        # Wait until a reader thread is receiving the reply, then freeze its sender:
        # the frame is now certainly half-way through the client's socket.
        def arriving(reply: Any = big) -> bool:  # not a closure: `big` is deleted below
            if _off_loop() != before:
                return True
            assert not reply.done(), "a large frame was received by the I/O loop"
            return False

        wait_until(arriving, REPLY_TIMEOUT, "the reply starts to arrive", interval=0.0005)
        assert lost == [], lost
        try:
            freeze(pid, REPLY_TIMEOUT)
        except AssertionError as e:
            try:  # how the client heard it end (an exit report names the signal)
                big.get(timeout=REPLY_TIMEOUT)
                outcome = "the reply arrived"
            except Exception as err:
                outcome = f"the reply failed: {err}"
            raise AssertionError(
                f"{e}; {outcome}; the worker said: {worker_log.read_text()[-3000:]}"
            ) from e
        stopped = True
        assert not big.done()
        for i in range(10):  # the I/O loop serves other connections meanwhile
            assert far_other.echo.call_one(i).get(timeout=REPLY_TIMEOUT) == i
            assert near.echo.call_one(i).get(timeout=REPLY_TIMEOUT) == i
        assert not big.done()
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)
    value = big.get(timeout=REPLY_TIMEOUT)
    check_blob(value, size)
    del value, big, arriving
    gc.collect()
    assert _off_loop() - before >= size - 1 * MiB  # all but what the I/O loop read first
    assert far_other.echo.call_one(-1).get(timeout=REPLY_TIMEOUT) == -1
    assert lost == []
    rprocs.stop().get(timeout=REPLY_TIMEOUT)
