"""Transfers across hosts: buffers owned on a worker host, moved over the data connection.

The "other host" is a ``danaus worker`` process on loopback with its own host
token (what ``ProcessJob`` starts), so the client and its local procs reach
its procs over authenticated TCP, as they would another machine. Its procs
are still in this kernel, so tests can SIGSTOP and SIGKILL them by pid.

A recording ``unhandled_fault_hook`` replaces the default one for the module
(a killed proc's failure reaches the client, and the default hook would end
pytest); the tests that kill wait for that failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import signal
import socket
import threading
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

import danaus.actor
from danaus._rdma import net
from danaus._runtime.node import this_node
from danaus._transport.auth import AuthError
from danaus._wire.ids import ProcId
from danaus.actor import ActorMesh, Future, HostMesh, ProcMesh
from danaus.rdma import RDMAAction, RDMABuffer, RDMAError, RDMAOwnerLostError
from danaus.testing import FaultRecorder, freeze, wait_until
from loopback_worker import loopback_worker

from .conftest import REPLY_TIMEOUT, Holder, random_bytes, started

MiB = 1 << 20


def _name() -> str:
    return uuid.uuid4().hex[:8]


def _wait_failed(faults: FaultRecorder, mesh: str) -> None:
    """Wait until the failure of actor mesh ``mesh`` (its proc was killed) reaches us."""
    faults.wait_until(
        lambda events: any(e.mesh_name == mesh for e in events),
        f"the failure of mesh {mesh!r}",
        REPLY_TIMEOUT,
    )


@pytest.fixture(scope="module")
def faults() -> Iterator[FaultRecorder]:
    recorder = FaultRecorder()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(danaus.actor, "unhandled_fault_hook", recorder)
        yield recorder


@pytest.fixture(scope="module")
def remote(faults: FaultRecorder) -> Iterator[HostMesh]:
    """One worker host on loopback, attached with this client's job secret."""
    with loopback_worker() as hm:
        yield hm


@pytest.fixture(scope="module")
def rprocs(remote: HostMesh) -> ProcMesh:
    pm = remote.spawn_procs(per_host={"r": 2})
    assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
    return pm  # stopped by the host mesh's shutdown


@pytest.fixture(scope="module")
def rholders(rprocs: ProcMesh) -> ActorMesh[Holder]:
    mesh = rprocs.spawn("rholders", Holder)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    return mesh


@pytest.fixture(scope="module")
def rgates(rprocs: ProcMesh) -> ActorMesh[Holder]:
    """A second mesh on the remote procs: it releases the gates ``rholders`` wait on."""
    mesh = rprocs.spawn("rgates", Holder)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    return mesh


@pytest.fixture
def victim(remote: HostMesh, faults: FaultRecorder) -> Iterator[tuple[ActorMesh[Holder], int, str]]:
    """A remote proc of this test's own, with a Holder, and its pid (tests stop or kill it).

    Its mesh is named ``victim-<hex>``, so a test that kills it can wait for its failure.
    """
    pm = remote.spawn_procs(per_host={"v": 1})
    name = f"victim-{_name()}"
    holder = pm.spawn(name, Holder)
    pid = holder.pid.call_one().get(timeout=REPLY_TIMEOUT)
    yield holder, pid, name
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    with contextlib.suppress(Exception):
        pm.stop().get(timeout=REPLY_TIMEOUT)


def _outcome(fut: Future[None]) -> BaseException | None:
    """Wait (bounded) for ``fut`` and return its exception (see test_failures._outcome)."""
    done = threading.Event()
    fut.add_done_callback(lambda _: done.set())
    started(fut)
    assert done.wait(REPLY_TIMEOUT), "the transfer neither finished nor failed"
    return fut.exception(timeout=0)


# -- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1024, 40 * MiB + 3])
def test_the_client_reads_and_writes_a_buffer_on_another_host(
    rholders: ActorMesh[Holder], n: int
) -> None:
    name = _name()
    buf = rholders.slice(r=0).make.call_one(name, n, "numpy", 1).get(timeout=REPLY_TIMEOUT)
    assert buf.backend == "tcp"
    dst = np.zeros(n, np.uint8)
    assert buf.read_into(dst).get(timeout=REPLY_TIMEOUT) is None
    assert np.array_equal(dst, random_bytes(n, 1))
    src = random_bytes(n, 2)
    assert buf.write_from(src).get(timeout=REPLY_TIMEOUT) is None
    want = hashlib.sha256(src).hexdigest()
    assert rholders.slice(r=0).digest.call_one(name).get(timeout=REPLY_TIMEOUT) == want


def test_partial_sizes_touch_only_the_leading_bytes(rholders: ActorMesh[Holder]) -> None:
    name = _name()
    n = 9 * MiB + 5  # split into several parts
    buf = rholders.slice(r=1).make.call_one(name, n, "bytearray", 3).get(timeout=REPLY_TIMEOUT)
    dst = bytearray(b"\xee" * (n + 1000))
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert bytes(dst[:n]) == random_bytes(n, 3).tobytes()
    assert bytes(dst[n:]) == b"\xee" * 1000
    src = random_bytes(5 * MiB + 1, 4).tobytes()
    buf.write_from(src).get(timeout=REPLY_TIMEOUT)
    after = rholders.slice(r=1).contents.call_one(name).get(timeout=REPLY_TIMEOUT)
    assert after[: len(src)] == src
    assert after[len(src) :] == random_bytes(n, 3).tobytes()[len(src) :]


def test_a_remote_actor_reads_and_writes_a_buffer_the_client_owns(
    rholders: ActorMesh[Holder],
) -> None:
    data = random_bytes(3 * MiB, 5)
    buf = RDMABuffer(data)
    try:
        got = rholders.slice(r=0).read.call_one(buf, 7).get(timeout=REPLY_TIMEOUT)
        assert got[: 3 * MiB] == data.tobytes() and got[3 * MiB :] == b"\x00" * 7
        src = random_bytes(MiB, 6).tobytes()
        rholders.slice(r=1).write.call_one(buf, src).get(timeout=REPLY_TIMEOUT)
        assert data[:MiB].tobytes() == src
    finally:
        buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_handle_pickled_before_the_owner_listened_on_tcp_still_reaches_it(
    rholders: ActorMesh[Holder],
) -> None:
    data = random_bytes(4096, 7)
    buf = RDMABuffer(data)
    try:
        # As if registered before this client attached: an address with no TCP entry.
        addr = ";".join(e for e in buf._owner_proc.addr.split(";") if not e.startswith("tcp://"))
        stale = pickle.loads(pickle.dumps(buf))
        stale._owner_proc = ProcId(buf._owner_proc.name, addr)
        assert "tcp://" in pickle.loads(pickle.dumps(stale))._owner_proc.addr
        got = rholders.slice(r=0).read.call_one(stale).get(timeout=REPLY_TIMEOUT)
        assert got == data.tobytes()
    finally:
        buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_handle_passes_between_actors_on_two_hosts(
    holders: ActorMesh[Holder], rholders: ActorMesh[Holder]
) -> None:
    # Owned on this host, read from the other one, handed over by a local actor.
    local = holders.slice(x=0).make.call_one(_name(), 200_000, "numpy", 8).get(timeout=30)
    got = holders.slice(x=1).relay_read.call_one(rholders.slice(r=1), local).get(timeout=30)
    assert got == random_bytes(200_000, 8).tobytes()
    # Owned on the other host, read from this one, handed over by a remote actor.
    far = rholders.slice(r=0).make.call_one(_name(), 300_000, "numpy", 9).get(timeout=30)
    got = rholders.slice(r=1).relay_read.call_one(holders.slice(x=0), far).get(timeout=30)
    assert got == random_bytes(300_000, 9).tobytes()
    # ... and read on its own host by a sibling proc (process_vm there).
    got = rholders.slice(r=1).read.call_one(far).get(timeout=REPLY_TIMEOUT)
    assert got == random_bytes(300_000, 9).tobytes()
    # A local actor writes into the remote buffer.
    src = random_bytes(300_000, 10).tobytes()
    holders.slice(x=1).write.call_one(far, src).get(timeout=REPLY_TIMEOUT)
    assert rholders.slice(r=1).read.call_one(far).get(timeout=REPLY_TIMEOUT) == src


def test_a_batch_mixes_local_and_remote_buffers(
    holders: ActorMesh[Holder], rholders: ActorMesh[Holder]
) -> None:
    mine = random_bytes(5000, 11)
    own = RDMABuffer(mine)  # this process
    near = holders.slice(x=0).make.call_one(_name(), 10_000, "numpy", 12).get(timeout=30)
    far = rholders.slice(r=0).make.call_one(_name(), 12 * MiB, "numpy", 13).get(timeout=30)
    far_w = rholders.slice(r=1).make.call_one(_name(), 700, "numpy", 14).get(timeout=30)
    d_own, d_near = bytearray(5000), np.zeros(10_000, np.uint8)
    d_far = np.zeros(12 * MiB, np.uint8)
    src = random_bytes(700, 15)
    action = (
        RDMAAction()
        .read_remote(d_own, own)
        .read_remote(d_near, near)
        .read_remote(d_far, far)
        .write_remote(far_w, src)
    )
    try:
        assert action.submit().get(timeout=REPLY_TIMEOUT) is None
        assert bytes(d_own) == mine.tobytes()
        assert d_near.tobytes() == random_bytes(10_000, 12).tobytes()
        assert np.array_equal(d_far, random_bytes(12 * MiB, 13))
        back = bytearray(700)
        far_w.read_into(back).get(timeout=REPLY_TIMEOUT)
        assert bytes(back) == src.tobytes()
        d_far[:] = 0  # and again
        action.submit().get(timeout=REPLY_TIMEOUT)
        assert np.array_equal(d_far, random_bytes(12 * MiB, 13))
    finally:
        own.drop().get(timeout=REPLY_TIMEOUT)


def test_many_concurrent_transfers_to_one_remote_owner_all_complete(
    rholders: ActorMesh[Holder],
) -> None:
    handles = [
        rholders.slice(r=i % 2).make.call_one(_name(), 1000 + i, "numpy", 100 + i).get(timeout=30)
        for i in range(24)
    ]
    dsts = [bytearray(b.size()) for b in handles]
    futs = [started(b.read_into(d)) for b, d in zip(handles, dsts, strict=True)]
    for f in futs:
        f.get(timeout=REPLY_TIMEOUT)
    for i, d in enumerate(dsts):
        assert bytes(d) == random_bytes(1000 + i, 100 + i).tobytes()


def test_a_proc_owned_tensor_round_trips_across_hosts(rholders: ActorMesh[Holder]) -> None:
    torch = pytest.importorskip("torch")
    name = _name()
    buf = rholders.slice(r=0).make.call_one(name, 4096, "torch", 16).get(timeout=REPLY_TIMEOUT)
    dst = torch.zeros(1024, dtype=torch.float32)  # raw bytes: any dtype of the same size
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert dst.numpy().tobytes() == random_bytes(4096, 16).tobytes()


# -- the owner's actor stays free -----------------------------------------------------------


def test_a_transfer_completes_while_the_remote_owners_actor_is_busy(
    rholders: ActorMesh[Holder], rgates: ActorMesh[Holder]
) -> None:
    name, key = _name(), _name()
    n = 40 * MiB
    buf = rholders.slice(r=0).make.call_one(name, n, "numpy", 21).get(timeout=REPLY_TIMEOUT)
    busy = rholders.slice(r=0).block.call_one(key)
    try:
        assert rgates.slice(r=0).wait_entered.call_one(key).get(timeout=REPLY_TIMEOUT)
        dst = np.zeros(n, np.uint8)
        buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
        assert np.array_equal(dst, random_bytes(n, 21))
        src = random_bytes(n, 22)
        buf.write_from(src).get(timeout=REPLY_TIMEOUT)
        assert not busy.done()  # the owner's actor was blocked all along
        # ... and the owner's other actors keep answering messages meanwhile.
        assert rgates.slice(r=0).pid.call_one().get(timeout=REPLY_TIMEOUT) > 0
    finally:
        rgates.slice(r=0).release.call_one(key).get(timeout=REPLY_TIMEOUT)
    assert busy.get(timeout=REPLY_TIMEOUT) is True
    want = hashlib.sha256(src).hexdigest()
    assert rholders.slice(r=0).digest.call_one(name).get(timeout=REPLY_TIMEOUT) == want


def test_the_owners_actors_answer_messages_during_a_long_transfer(
    rholders: ActorMesh[Holder], rgates: ActorMesh[Holder]
) -> None:
    n = 256 * MiB
    buf = rholders.slice(r=1).fill.call_one(_name(), n, 3).get(timeout=REPLY_TIMEOUT)
    dst = np.zeros(n, np.uint8)  # fresh pages: the read takes a while
    fut = started(buf.read_into(dst))
    answered_during = 0
    while True:
        rgates.slice(r=1).pid.call_one().get(timeout=REPLY_TIMEOUT)
        if fut.done():
            break
        answered_during += 1  # answered while the bytes were still moving
    fut.get(timeout=0)
    assert dst[0] == dst[-1] == 3
    assert answered_during >= 1


# -- failures -------------------------------------------------------------------------------


def test_a_dropped_remote_buffer_fails_later_transfers_naming_it(
    rholders: ActorMesh[Holder],
) -> None:
    buf = rholders.slice(r=0).make.call_one(_name(), 100, "numpy", 30).get(timeout=REPLY_TIMEOUT)
    buf.read_into(bytearray(100)).get(timeout=REPLY_TIMEOUT)
    buf.drop().get(timeout=REPLY_TIMEOUT)
    for fut in (buf.read_into(bytearray(100)), buf.write_from(b"x" * 50)):
        with pytest.raises(RDMAError, match="dropped") as info:
            fut.get(timeout=REPLY_TIMEOUT)
        assert info.value.buffer == str(buf)
    # The connection survives a refusal: the next transfer works.
    ok = rholders.slice(r=0).make.call_one(_name(), 100, "numpy", 31).get(timeout=REPLY_TIMEOUT)
    dst = bytearray(100)
    ok.write_from(random_bytes(100, 32)).get(timeout=REPLY_TIMEOUT)
    ok.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert bytes(dst) == random_bytes(100, 32).tobytes()


@pytest.mark.parametrize("warm", [False, True], ids=["first-contact", "pooled-connection"])
def test_a_stopped_owner_times_out_with_a_timeout_error_naming_the_buffer(
    victim: tuple[ActorMesh[Holder], int, str], warm: bool
) -> None:
    holder, pid, _ = victim
    buf = holder.fill.call_one("big", MiB, 7).get(timeout=REPLY_TIMEOUT)
    if warm:  # the data server is known and a connection is pooled
        buf.read_into(bytearray(MiB)).get(timeout=REPLY_TIMEOUT)
    freeze(pid, REPLY_TIMEOUT)  # far shorter than the heartbeat timeout: not lost
    try:
        err = _outcome(buf.read_into(bytearray(MiB), timeout=0.3))
        assert isinstance(err, TimeoutError)
        assert str(buf) in str(err) and "0.3 s" in str(err)
    finally:
        os.kill(pid, signal.SIGCONT)
    dst = bytearray(MiB)  # the owner answers again: the buffer still works
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert dst == b"\x07" * MiB


def _assert_owner_lost(err: BaseException | None, buf: RDMABuffer) -> None:
    assert isinstance(err, RDMAOwnerLostError), repr(err)
    assert str(buf) in str(err) and err.buffer == str(buf) and err.owner == buf.owner


def test_an_owner_killed_in_the_middle_of_a_transfer_fails_it_at_once(
    victim: tuple[ActorMesh[Holder], int, str], faults: FaultRecorder
) -> None:
    holder, pid, name = victim
    n = 256 * MiB
    buf = holder.fill.call_one("big", n, 7).get(timeout=REPLY_TIMEOUT)
    dst = np.zeros(n, np.uint8)
    fut = started(buf.read_into(dst, timeout=60))
    # Spin until the first bytes land: the transfer has begun.
    wait_until(lambda: dst[0] != 0 or fut.done(), REPLY_TIMEOUT, "the transfer starts", interval=0)
    freeze(pid, REPLY_TIMEOUT)  # freeze it mid-transfer, then kill it
    assert dst[0] == 7, "the transfer never started"
    assert not fut.done(), "the transfer finished before the owner could be stopped"
    os.kill(pid, signal.SIGKILL)
    err = _outcome(fut)
    _assert_owner_lost(err, buf)  # the owner's loss, not the 60 s deadline
    # Later transfers fail at once too, and dropping is harmless.
    with pytest.raises(RDMAOwnerLostError):
        buf.write_from(b"abc").get(timeout=REPLY_TIMEOUT)
    buf.drop().get(timeout=REPLY_TIMEOUT)
    _wait_failed(faults, name)


def test_an_owner_killed_before_the_transfer_fails_it_at_once(
    victim: tuple[ActorMesh[Holder], int, str], faults: FaultRecorder
) -> None:
    holder, pid, name = victim
    buf = holder.fill.call_one("big", MiB, 7).get(timeout=REPLY_TIMEOUT)
    buf.read_into(bytearray(MiB)).get(timeout=REPLY_TIMEOUT)  # a pooled connection remains
    os.kill(pid, signal.SIGKILL)
    _wait_failed(faults, name)
    _assert_owner_lost(_outcome(buf.read_into(bytearray(MiB))), buf)


def test_a_stopped_owner_killed_while_the_transfer_waits_fails_it(
    victim: tuple[ActorMesh[Holder], int, str], faults: FaultRecorder
) -> None:
    holder, pid, name = victim
    buf = holder.fill.call_one("big", MiB, 7).get(timeout=REPLY_TIMEOUT)
    freeze(pid, REPLY_TIMEOUT)  # the first contact (RDMA_DATA) waits for the owner
    try:
        fut = started(buf.read_into(bytearray(MiB)))
        assert not fut.done()  # the owner is stopped: its first contact cannot answer
    finally:
        os.kill(pid, signal.SIGKILL)
    _assert_owner_lost(_outcome(fut), buf)
    _wait_failed(faults, name)


# -- authentication ----------------------------------------------------------------------


def _data_address(buf: RDMABuffer) -> tuple[str, int]:
    buf.read_into(bytearray(buf.size())).get(timeout=REPLY_TIMEOUT)  # learns the address
    client = this_node().part(net.DataClient)  # the client node's data connections
    address = client.known_address((buf._owner_proc.name, buf._pid))
    assert address is not None
    return address


def test_the_data_connection_refuses_a_peer_without_the_job_secret(
    rholders: ActorMesh[Holder],
) -> None:
    buf = rholders.slice(r=0).make.call_one(_name(), 64, "numpy", 40).get(timeout=REPLY_TIMEOUT)
    address = _data_address(buf)
    with pytest.raises(AuthError):
        net.connect(address, b"not the job secret at all", 5.0, lambda s: True)
    # A peer that answers the challenge wrongly is refused and closed: no request is read.
    with socket.create_connection(address, timeout=5) as s:
        challenge = s.recv(64)
        assert challenge.startswith(b"DNS1")
        s.sendall(bytes(64))  # a wrong answer
        rest = b""
        while chunk := s.recv(64):
            rest += chunk
        assert rest == bytes(32)  # the refusal (no valid MAC), then EOF
    # The right secret works.
    secret = this_node().runtime.secret
    good, _session = net.connect(address, secret, 5.0, lambda s: True)
    good.close()
