"""An owner that dies or stops answering fails its transfers: at once, clearly, never a hang.

Each test kills or stops a child proc spawned by a ``Parent`` actor (which
absorbs the failure), never the shared procs or the test process.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from danaus.actor import ActorMesh, Future, ProcMesh, SupervisionError
from danaus.rdma import RDMAError, RDMAOwnerLostError
from danaus.testing import wait_until

from .conftest import REPLY_TIMEOUT, Parent, started

MiB = 1 << 20


@pytest.fixture(scope="module")
def parent(procs: ProcMesh) -> Iterator[ActorMesh[Parent]]:
    mesh = procs.spawn("parents", Parent)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    yield mesh.slice(x=0)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _outcome(fut: Future[None]) -> BaseException | None:
    """Wait (bounded) for ``fut`` and return its exception.

    Waits on a done-callback rather than ``fut.get()``: ``Future._wait`` mistakes
    a call that failed *with* ``TimeoutError`` for its own wait timing out.
    """
    done = threading.Event()
    fut.add_done_callback(lambda _: done.set())
    started(fut)
    assert done.wait(REPLY_TIMEOUT), "the transfer neither finished nor failed"
    return fut.exception(timeout=0)


def _assert_owner_lost(err: BaseException, buf: object) -> None:
    assert isinstance(err, RDMAOwnerLostError)
    assert isinstance(err, SupervisionError)  # the owner's death is a supervision event
    assert isinstance(err, RDMAError)
    assert str(buf) in str(err)
    assert err.buffer == str(buf)
    assert err.owner == buf.owner  # type: ignore[attr-defined]


def test_a_transfer_from_a_dead_owner_fails_with_owner_lost(parent: ActorMesh[Parent]) -> None:
    buf, pid = parent.spawn_child.call_one(MiB, 7).get(timeout=REPLY_TIMEOUT)
    _kill(pid)
    with pytest.raises(RDMAOwnerLostError) as info:
        buf.read_into(bytearray(MiB)).get(timeout=REPLY_TIMEOUT)
    _assert_owner_lost(info.value, buf)
    with pytest.raises(RDMAOwnerLostError):  # and so does every later one
        buf.write_from(b"abc").get(timeout=REPLY_TIMEOUT)
    buf.drop().get(timeout=REPLY_TIMEOUT)  # dropping a dead owner's buffer is harmless


def test_an_owner_killed_while_the_transfer_waits_for_it_fails_the_transfer(
    parent: ActorMesh[Parent],
) -> None:
    buf, pid = parent.spawn_child.call_one(MiB, 7).get(timeout=REPLY_TIMEOUT)
    os.kill(pid, signal.SIGSTOP)  # the owner cannot answer the check: the transfer waits
    try:
        fut = started(buf.read_into(bytearray(MiB)))
        assert not fut.done()
    finally:
        _kill(pid)
    with pytest.raises(RDMAOwnerLostError) as info:
        fut.get(timeout=REPLY_TIMEOUT)
    _assert_owner_lost(info.value, buf)


@pytest.mark.timeout(120)
def test_an_owner_killed_in_the_middle_of_a_large_copy_fails_the_transfer(
    parent: ActorMesh[Parent],
) -> None:
    n = 512 * MiB
    buf, pid = parent.spawn_child.call_one(n, 7).get(timeout=60)
    dst = np.zeros(n, np.uint8)  # fresh pages: the copy takes far longer than a kill
    fut = started(buf.read_into(dst, timeout=60))
    # Spin until the first bytes land: the copy has begun.
    wait_until(lambda: dst[0] != 0 or fut.done(), 30, "the copy starts", interval=0)
    assert dst[0] == 7, "the copy never started"
    assert dst[-1] == 0, "the copy finished before the owner could be killed"
    _kill(pid)
    with pytest.raises(RDMAOwnerLostError) as info:
        fut.get(timeout=REPLY_TIMEOUT)
    _assert_owner_lost(info.value, buf)
    assert "exited during the transfer" in str(info.value)


def test_a_transfer_past_its_timeout_fails_with_timeout_error(parent: ActorMesh[Parent]) -> None:
    buf, pid = parent.spawn_child.call_one(MiB, 7).get(timeout=REPLY_TIMEOUT)
    os.kill(pid, signal.SIGSTOP)  # the owner's runtime cannot answer before the deadline
    try:
        fut = buf.read_into(bytearray(MiB), timeout=0.2)
        err = _outcome(fut)
        assert isinstance(err, TimeoutError)
        assert str(buf) in str(err)
        assert "0.2 s" in str(err)
    finally:
        os.kill(pid, signal.SIGCONT)
    dst = bytearray(MiB)  # the owner answers again: the buffer still works
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert dst == b"\x07" * MiB


def test_timeouts_that_are_not_positive_numbers_are_refused(parent: ActorMesh[Parent]) -> None:
    buf, _ = parent.spawn_child.call_one(16, 7).get(timeout=REPLY_TIMEOUT)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout"):
            buf.read_into(bytearray(16), timeout=bad)
    with pytest.raises(TypeError, match="timeout"):
        buf.write_from(b"x", timeout="1")  # type: ignore[arg-type]
