"""The owner's side of the data plane, without a transfer: the node's registry of
buffers (ids never reused, leases that pin memory across a drop, a lost holder's
leases ended) and the errors a failed transfer raises."""

from __future__ import annotations

import pickle

import pytest

from danaus._errors import SupervisionError
from danaus._rdma.errors import RDMAError, RDMAOwnerLostError, RDMATamperedError
from danaus._rdma.memory import local_memory
from danaus._rdma.registry import BufferRegistry


class Freed:
    """Counts the ``on_free`` calls of a registration."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def _memory(n: int = 64) -> tuple[bytearray, object]:
    data = bytearray(n)
    return data, local_memory(data, "buf")


def test_ids_count_up_and_a_dropped_id_is_refused_saying_so() -> None:
    reg = BufferRegistry()
    _, mem = _memory()
    first, second = reg.register(mem), reg.register(mem)
    assert (first, second) == (1, 2)
    addr, n = mem.addr, mem.nbytes  # type: ignore[attr-defined]
    assert reg.check(first, addr, n) is None
    reg.drop([first]).result(0)
    assert reg.check(first, addr, n) == "it was dropped"
    assert reg.check(99, addr, n) == "it is not registered"
    assert reg.register(mem) == 3  # never reused
    assert [b["id"] for b in reg.registered_buffers()] == [2, 3]


def test_a_drop_waits_for_the_transfers_under_way_and_frees_the_memory_after_them() -> None:
    reg = BufferRegistry()
    _, mem = _memory()
    freed = Freed()
    bid = reg.register(mem, on_free=freed)
    entry = (bid, mem.addr, mem.nbytes)  # type: ignore[attr-defined]
    answers, lease1, regs = reg.lease([entry])
    assert answers == [None] and lease1 is not None and regs[0].leases == 1
    _, lease2, _ = reg.lease([entry], holder="reader-proc")
    done = reg.drop([bid])
    # dropped: new transfers fail at once, the ones under way keep the memory alive
    assert reg.lease([entry])[:2] == (["it was dropped"], None)
    assert not done.done() and freed.calls == 0
    reg.release(lease1)
    assert not done.done()
    assert reg.release_holder("reader-proc") == [lease2]  # that proc was lost
    assert done.result(0) is None and freed.calls == 1
    reg.release(lease1)  # twice: ignored
    assert freed.calls == 1 and reg.leases() == 0


def test_a_lease_is_all_or_nothing() -> None:
    reg = BufferRegistry()
    _, mem = _memory()
    good = reg.register(mem)
    entries = [(good, mem.addr, mem.nbytes), (42, 0, 1)]  # type: ignore[attr-defined]
    answers, lease, regs = reg.lease(entries)
    assert answers == [None, "it is not registered"] and lease is None and regs == []
    assert reg.leases() == 0
    reg.release(None)  # nothing to release


def test_the_end_of_the_node_forgets_everything_and_frees_what_it_held() -> None:
    reg = BufferRegistry()
    _, mem = _memory()
    held, leased = Freed(), Freed()
    a = reg.register(mem, on_free=held)
    b = reg.register(mem, on_free=leased)
    _, lease, _ = reg.lease([(b, mem.addr, mem.nbytes)])  # type: ignore[attr-defined]
    waiting = reg.drop([b])
    reg.on_node_end()
    assert waiting.result(0) is None  # a drop that waited for a lease completes
    assert (held.calls, leased.calls) == (1, 1)
    assert reg.check(a, mem.addr, mem.nbytes) == (  # type: ignore[attr-defined]
        "its owner's session ended (shutdown_context)"
    )
    late = Freed()
    reg.register(mem, on_free=late)  # after the end: nothing holds it
    assert late.calls == 1 and reg.registered_buffers() == []
    reg.release(lease)


def test_a_failing_backend_deregistration_still_releases_the_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg = BufferRegistry()
    _, mem = _memory()

    def boom() -> None:
        raise OSError("backend gone")

    bid = reg.register(mem, on_free=boom)
    assert reg.drop([bid]).result(0) is None
    assert "ending the backend registration of a dropped buffer failed" in caplog.text


def test_transfer_errors_keep_their_buffer_and_owner_and_their_kind_across_pickle() -> None:
    lost = RDMAOwnerLostError("owner died", buffer="<buf 1>", owner="p/m[0]")
    assert isinstance(lost, RDMAError) and isinstance(lost, SupervisionError)
    for err in (lost, RDMAError("no", buffer="b", owner="o"), RDMATamperedError("tag")):
        again = pickle.loads(pickle.dumps(err))
        assert type(again) is type(err) and str(again) == str(err)
        assert (again.buffer, again.owner) == (err.buffer, err.owner)
