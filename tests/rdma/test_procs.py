"""Transfers between real processes: the client, two procs, and handles passed around."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import numpy as np
import pytest

from danaus.actor import ActorMesh, ProcMesh
from danaus.rdma import RDMAAction, RDMABuffer, RDMAError

from .conftest import REPLY_TIMEOUT, AsyncReader, Holder, random_bytes, started

MiB = 1 << 20


def _name() -> str:
    return uuid.uuid4().hex[:8]


def test_client_reads_the_bytes_of_a_buffer_owned_by_a_proc(holders: ActorMesh[Holder]) -> None:
    name = _name()
    buf = holders.slice(x=0).make.call_one(name, 100_003, "numpy", 1).get(timeout=REPLY_TIMEOUT)
    assert buf.size() == 100_003
    dst = np.zeros(buf.size(), dtype=np.uint8)
    assert buf.read_into(dst).get(timeout=REPLY_TIMEOUT) is None
    assert dst.tobytes() == holders.slice(x=0).contents.call_one(name).get(timeout=REPLY_TIMEOUT)
    assert dst.tobytes() == random_bytes(100_003, 1).tobytes()


def test_client_writes_into_a_buffer_owned_by_a_proc(holders: ActorMesh[Holder]) -> None:
    name = _name()
    buf = holders.slice(x=1).make.call_one(name, 4096, "bytearray", 2).get(timeout=REPLY_TIMEOUT)
    src = random_bytes(4096, 3)
    buf.write_from(src).get(timeout=REPLY_TIMEOUT)
    assert holders.slice(x=1).contents.call_one(name).get(timeout=REPLY_TIMEOUT) == src.tobytes()


def test_a_smaller_buffer_fills_the_leading_bytes_of_dst_and_leaves_the_rest(
    holders: ActorMesh[Holder],
) -> None:
    buf = holders.slice(x=0).make.call_one(_name(), 1000, "numpy", 4).get(timeout=REPLY_TIMEOUT)
    dst = bytearray(b"\xee" * 1500)
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert bytes(dst[:1000]) == random_bytes(1000, 4).tobytes()
    assert bytes(dst[1000:]) == b"\xee" * 500


def test_a_smaller_src_overwrites_only_the_leading_bytes_of_the_buffer(
    holders: ActorMesh[Holder],
) -> None:
    name = _name()
    buf = holders.slice(x=1).make.call_one(name, 1000, "numpy", 5).get(timeout=REPLY_TIMEOUT)
    src = random_bytes(300, 6).tobytes()
    buf.write_from(src).get(timeout=REPLY_TIMEOUT)
    after = holders.slice(x=1).contents.call_one(name).get(timeout=REPLY_TIMEOUT)
    assert after[:300] == src
    assert after[300:] == random_bytes(1000, 5).tobytes()[300:]


def test_a_read_only_bytes_buffer_can_be_read_but_not_written(holders: ActorMesh[Holder]) -> None:
    buf = holders.slice(x=0).make.call_one(_name(), 777, "bytes", 7).get(timeout=REPLY_TIMEOUT)
    assert buf.readonly
    dst = bytearray(777)
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert bytes(dst) == random_bytes(777, 7).tobytes()
    with pytest.raises(ValueError, match="read-only"):
        buf.write_from(b"x")


def test_a_proc_reads_and_writes_a_buffer_owned_by_its_sibling(
    holders: ActorMesh[Holder],
) -> None:
    name = _name()
    buf = holders.slice(x=0).make.call_one(name, 5000, "numpy", 8).get(timeout=REPLY_TIMEOUT)
    got = holders.slice(x=1).read.call_one(buf).get(timeout=REPLY_TIMEOUT)
    assert got == random_bytes(5000, 8).tobytes()
    new = random_bytes(5000, 9).tobytes()
    holders.slice(x=1).write.call_one(buf, new).get(timeout=REPLY_TIMEOUT)
    assert holders.slice(x=0).contents.call_one(name).get(timeout=REPLY_TIMEOUT) == new


def test_procs_read_and_write_a_buffer_owned_by_the_client(holders: ActorMesh[Holder]) -> None:
    data = random_bytes(64 * 1024, 10)
    buf = RDMABuffer(data)
    try:
        assert buf.owner.endswith("root[0]")
        got = holders.read.call(buf).get(timeout=REPLY_TIMEOUT)
        assert list(got.values()) == [data.tobytes()] * 2
        new = random_bytes(1000, 11).tobytes()
        holders.slice(x=1).write.call_one(buf, new).get(timeout=REPLY_TIMEOUT)
        assert data[:1000].tobytes() == new
    finally:
        buf.drop().get(timeout=REPLY_TIMEOUT)


def test_a_handle_passed_through_two_actors_still_reads_the_owners_memory(
    holders: ActorMesh[Holder],
) -> None:
    buf = holders.slice(x=0).make.call_one(_name(), 3000, "numpy", 12).get(timeout=REPLY_TIMEOUT)
    # client -> holder[1] -> holder[0] (the owner's own proc reads it through the handle)
    got = holders.slice(x=1).relay_read.call_one(holders.slice(x=0), buf).get(timeout=REPLY_TIMEOUT)
    assert got == random_bytes(3000, 12).tobytes()
    # client -> holder[0] -> holder[1]
    got = holders.slice(x=0).relay_read.call_one(holders.slice(x=1), buf).get(timeout=REPLY_TIMEOUT)
    assert got == random_bytes(3000, 12).tobytes()


def test_an_async_actor_awaits_a_read(procs: ProcMesh, holders: ActorMesh[Holder]) -> None:
    readers = procs.spawn("async_readers", AsyncReader)
    try:
        buf = holders.slice(x=0).make.call_one(_name(), 2048, "numpy", 13).get(timeout=30)
        got = readers.read.call(buf).get(timeout=REPLY_TIMEOUT)
        assert list(got.values()) == [random_bytes(2048, 13).tobytes()] * 2
    finally:
        readers.stop().get(timeout=REPLY_TIMEOUT)


def test_a_batch_reads_and_writes_several_owners_in_one_future(
    holders: ActorMesh[Holder],
) -> None:
    n0, n1 = _name(), _name()
    b0 = holders.slice(x=0).make.call_one(n0, 10_000, "numpy", 14).get(timeout=REPLY_TIMEOUT)
    b1 = holders.slice(x=1).make.call_one(n1, 20_000, "numpy", 15).get(timeout=REPLY_TIMEOUT)
    w1 = holders.slice(x=1).make.call_one(_name() + "w", 500, "numpy", 16)
    w1 = w1.get(timeout=REPLY_TIMEOUT)
    d0 = np.zeros(10_000, np.uint8)
    d1 = np.zeros(20_000, np.uint8)
    src = random_bytes(500, 17)
    action = RDMAAction().read_remote(d0, b0).read_remote(d1, b1).write_remote(w1, src)
    assert len(action) == 3
    assert action.submit().get(timeout=REPLY_TIMEOUT) is None
    assert d0.tobytes() == random_bytes(10_000, 14).tobytes()
    assert d1.tobytes() == random_bytes(20_000, 15).tobytes()
    back = bytearray(500)
    w1.read_into(back).get(timeout=REPLY_TIMEOUT)
    assert bytes(back) == src.tobytes()
    # A batch can be submitted again.
    d0[:] = 0
    action.submit().get(timeout=REPLY_TIMEOUT)
    assert d0.tobytes() == random_bytes(10_000, 14).tobytes()


def test_a_batch_fails_if_any_buffer_was_dropped_and_names_it(
    holders: ActorMesh[Holder],
) -> None:
    good = holders.slice(x=0).make.call_one(_name(), 100, "numpy", 18).get(timeout=REPLY_TIMEOUT)
    gone = holders.slice(x=1).make.call_one(_name(), 100, "numpy", 19).get(timeout=REPLY_TIMEOUT)
    gone.drop().get(timeout=REPLY_TIMEOUT)
    fut = RDMAAction().read_remote(bytearray(100), good).read_remote(bytearray(100), gone).submit()
    with pytest.raises(RDMAError, match="dropped") as info:
        fut.get(timeout=REPLY_TIMEOUT)
    assert str(gone) in str(info.value)
    assert info.value.buffer == str(gone)


def test_after_drop_every_holder_of_the_handle_gets_an_error(holders: ActorMesh[Holder]) -> None:
    buf = holders.slice(x=0).make.call_one(_name(), 100, "numpy", 20).get(timeout=REPLY_TIMEOUT)
    holders.slice(x=1).drop.call_one(buf).get(timeout=REPLY_TIMEOUT)  # dropped by a non-owner
    with pytest.raises(RDMAError, match="dropped"):
        buf.read_into(bytearray(100)).get(timeout=REPLY_TIMEOUT)
    with pytest.raises(RDMAError, match="dropped"):
        buf.write_from(b"abc").get(timeout=REPLY_TIMEOUT)
    with pytest.raises(Exception, match="dropped") as info:  # an ActorError from the proc
        holders.slice(x=1).read.call_one(buf).get(timeout=REPLY_TIMEOUT)
    assert str(buf) in str(info.value)
    buf.drop().get(timeout=REPLY_TIMEOUT)  # dropping twice is harmless


def test_a_transfer_completes_while_the_owners_actor_is_busy(
    holders: ActorMesh[Holder], gates: ActorMesh[Holder]
) -> None:
    name, key = _name(), _name()
    buf = holders.slice(x=0).make.call_one(name, 1 * MiB, "numpy", 21).get(timeout=REPLY_TIMEOUT)
    busy = holders.slice(x=0).block.call_one(key)
    try:
        assert gates.slice(x=0).wait_entered.call_one(key).get(timeout=REPLY_TIMEOUT)
        dst = np.zeros(MiB, np.uint8)
        buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
        assert dst.tobytes() == random_bytes(MiB, 21).tobytes()
        src = random_bytes(MiB, 22)
        buf.write_from(src).get(timeout=REPLY_TIMEOUT)
        assert not busy.done()  # the owner's actor was blocked all along
    finally:
        gates.slice(x=0).release.call_one(key).get(timeout=REPLY_TIMEOUT)
    assert busy.get(timeout=REPLY_TIMEOUT) is True
    assert holders.slice(x=0).contents.call_one(name).get(timeout=REPLY_TIMEOUT) == src.tobytes()


def test_a_large_buffer_round_trips_through_the_parallel_copy(holders: ActorMesh[Holder]) -> None:
    name = _name()
    n = 48 * MiB + 12345  # split across worker threads, not a multiple of a page
    buf = holders.slice(x=1).make.call_one(name, n, "numpy", 23).get(timeout=REPLY_TIMEOUT)
    dst = np.zeros(n, np.uint8)
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert np.array_equal(dst, random_bytes(n, 23))
    src = random_bytes(n, 24)
    buf.write_from(src).get(timeout=REPLY_TIMEOUT)
    want = hashlib.sha256(src).hexdigest()
    assert holders.slice(x=1).digest.call_one(name).get(timeout=REPLY_TIMEOUT) == want


def test_many_concurrent_transfers_all_complete(holders: ActorMesh[Holder]) -> None:
    bufs = [
        holders.slice(x=i % 2).make.call_one(_name(), 1000 + i, "numpy", 100 + i) for i in range(20)
    ]
    handles = [f.get(timeout=REPLY_TIMEOUT) for f in bufs]
    dsts = [bytearray(b.size()) for b in handles]
    futs = [started(b.read_into(d)) for b, d in zip(handles, dsts, strict=True)]
    for f in futs:
        f.get(timeout=REPLY_TIMEOUT)
    for i, d in enumerate(dsts):
        assert bytes(d) == random_bytes(1000 + i, 100 + i).tobytes()


def test_a_proc_owned_tensor_round_trips(holders: ActorMesh[Holder]) -> None:
    torch = pytest.importorskip("torch")
    name = _name()
    buf = holders.slice(x=0).make.call_one(name, 4096, "torch", 25).get(timeout=REPLY_TIMEOUT)
    dst = torch.zeros(1024, dtype=torch.float32)  # 4096 bytes, another dtype: bytes are bytes
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert dst.numpy().tobytes() == random_bytes(4096, 25).tobytes()
    src = torch.arange(1, 513, dtype=torch.int64)  # 4096 bytes
    buf.write_from(src).get(timeout=REPLY_TIMEOUT)
    after = holders.slice(x=0).contents.call_one(name).get(timeout=REPLY_TIMEOUT)
    assert after == src.numpy().tobytes()
    view = torch.zeros(3000, dtype=torch.uint8)[1000:]  # a view with a storage offset
    small = holders.slice(x=1).make.call_one(_name(), 2000, "numpy", 26).get(timeout=REPLY_TIMEOUT)
    small.read_into(view).get(timeout=REPLY_TIMEOUT)
    assert view.numpy().tobytes() == random_bytes(2000, 26).tobytes()


def test_owner_names_the_actor_that_registered_the_buffer(holders: ActorMesh[Holder]) -> None:
    buf = holders.slice(x=1).make.call_one(_name(), 10, "numpy", 27).get(timeout=REPLY_TIMEOUT)
    assert isinstance(buf.owner, str)
    assert "/holders" in buf.owner and buf.owner.endswith("[1]")
    assert buf.backend == "process_vm"


def test_a_transfer_starts_when_its_future_is_first_waited_for(
    holders: ActorMesh[Holder],
) -> None:
    """Monarch's rule (its test_rdma_concurrent_2gb_writes_in_order, at 1 MiB): a read
    issued before a write, but awaited after it, sees what the write put there."""
    name = _name()
    owner = holders.slice(x=0)
    buf = owner.make.call_one(name, MiB, "numpy", 10).get(timeout=REPLY_TIMEOUT)
    src = random_bytes(MiB, 11)
    dst = np.zeros(MiB, dtype=np.uint8)

    async def main() -> None:
        read = buf.read_into(dst, timeout=REPLY_TIMEOUT)
        write = buf.write_from(src, timeout=REPLY_TIMEOUT)
        assert not read.done() and not write.done()
        await write
        await read

    asyncio.run(main())
    assert dst.tobytes() == src.tobytes()
    assert owner.contents.call_one(name).get(timeout=REPLY_TIMEOUT) == src.tobytes()


def test_a_transfer_never_waited_for_never_runs(holders: ActorMesh[Holder]) -> None:
    name = _name()
    owner = holders.slice(x=1)
    buf = owner.make.call_one(name, 4096, "bytearray", 12).get(timeout=REPLY_TIMEOUT)
    src = random_bytes(4096, 13)
    unawaited = buf.write_from(src)
    # An action that is submitted and waited for runs; the write above has not.
    dst = bytearray(4096)
    RDMAAction().read_into(buf, dst).submit().get(timeout=REPLY_TIMEOUT)
    assert bytes(dst) == random_bytes(4096, 12).tobytes()
    assert not unawaited.done()
    unawaited.get(timeout=REPLY_TIMEOUT)  # the first wait starts it
    assert owner.contents.call_one(name).get(timeout=REPLY_TIMEOUT) == src.tobytes()
