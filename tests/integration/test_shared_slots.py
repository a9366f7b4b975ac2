"""Offloaded arrays between procs of one host travel in shared snapshot slots.

The caller copies an array once into a slot (a shared mapping), the receiver
maps it copy-on-write and hands it to the actor; the slot goes back to the
caller only once nothing refers to the mapping there. So: an array the actor
keeps never changes under it, whatever is sent next; an actor may write to
what it received; slots are reused once returned; and the slots stay within
``snapshot_pool`` (beyond it, a private snapshot is copied as before).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import danaus.config
from danaus._runtime.messaging.faces import OffloadCalls
from danaus._runtime.messaging.offload import Offloader
from danaus._runtime.node import this_node
from danaus._wire.ids import ProcId
from danaus._wire.protocol import Kind, Message, Offload
from danaus.actor import Actor, ActorMesh, endpoint, this_host
from danaus.testing import wait_until

from .conftest import REPLY_TIMEOUT

MiB = 1 << 20
N = 4 * MiB


class Keeper(Actor):
    def __init__(self) -> None:
        self.kept: list[Any] = []

    @endpoint
    def keep(self, a: Any) -> int:
        self.kept.append(a)
        return int(a[0])

    @endpoint
    def ranges(self) -> list[tuple[int, int]]:
        return [(int(a.min()), int(a.max())) for a in self.kept]

    @endpoint
    def scribble(self, a: Any) -> int:
        first = int(a.max())
        a[:] = 9  # the actor owns what it received (copy-on-write)
        return first * 1000 + int(a.min())

    @endpoint
    def drop(self) -> int:
        n = len(self.kept)
        self.kept.clear()
        gc.collect()
        return n


@pytest.fixture(scope="module")
def keeper() -> Iterator[ActorMesh[Keeper]]:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = pm.spawn("keeper", Keeper)
    mesh.keep.call_one(np.zeros(N, np.uint8)).get(timeout=REPLY_TIMEOUT)  # offload agreed
    mesh.drop.call_one().get(timeout=REPLY_TIMEOUT)
    yield mesh
    pm.stop().get(timeout=REPLY_TIMEOUT)


def _peer(mesh: ActorMesh[Keeper]) -> str:
    [proc] = danaus.stats(mesh).get(timeout=REPLY_TIMEOUT).procs
    return proc.proc


def _wait_returned(peer: str) -> None:
    off = this_node().runtime.offload
    wait_until(
        lambda: off.slots_lent(peer),
        REPLY_TIMEOUT,
        "the lent slots come back",
        until=lambda lent: not lent,
        interval=0.005,
    )


def _require_shared(mesh: ActorMesh[Keeper]) -> None:
    """Fail, saying why, where shared slots cannot be used (never a silent skip)."""
    off = this_node().runtime.offload
    assert off.shared, "no memfd_create or MAP_SHARED here: shared slots are off"
    assert _peer(mesh) in off.ok_peers, (
        "the actor's proc cannot read this process's memory (process_vm_readv refused: "
        "see /proc/sys/kernel/yama/ptrace_scope), so nothing is offloaded to it"
    )


def test_kept_arrays_never_change_and_slots_come_back(keeper) -> None:
    _require_shared(keeper)
    off = this_node().runtime.offload
    peer = _peer(keeper)
    a = np.zeros(N, np.uint8)
    for v in range(1, 7):
        a[:] = v
        assert keeper.keep.call_one(a).get(timeout=REPLY_TIMEOUT) == v
    a[:] = 0
    assert keeper.ranges.call_one().get(timeout=REPLY_TIMEOUT) == [(v, v) for v in range(1, 7)]
    assert off.slots_lent(peer) == 6  # all still mapped by the actor
    assert keeper.drop.call_one().get(timeout=REPLY_TIMEOUT) == 6
    _wait_returned(peer)
    made = off.slots_made
    for v in range(11, 17):  # the returned slots serve again
        a[:] = v
        assert keeper.keep.call_one(a).get(timeout=REPLY_TIMEOUT) == v
    assert off.slots_made == made
    assert keeper.ranges.call_one().get(timeout=REPLY_TIMEOUT) == [(v, v) for v in range(11, 17)]
    keeper.drop.call_one().get(timeout=REPLY_TIMEOUT)
    _wait_returned(peer)


def test_the_receiver_may_write_to_what_it_got(keeper) -> None:
    a = np.full(N, 5, np.uint8)
    for _ in range(3):  # the same slot again and again: the actor's writes stay its own
        assert keeper.scribble.call_one(a).get(timeout=REPLY_TIMEOUT) == 5009  # saw 5s, wrote 9s
    assert int(a.min()) == int(a.max()) == 5
    _wait_returned(_peer(keeper))


def test_slots_stay_within_snapshot_pool(keeper) -> None:
    _require_shared(keeper)
    off = this_node().runtime.offload
    peer = _peer(keeper)
    a = np.zeros(N, np.uint8)
    with danaus.config.configured(snapshot_pool=2 * N):
        for v in range(1, 6):  # kept: only two fit in slots, the rest copied privately
            a[:] = v
            assert keeper.keep.call_one(a).get(timeout=REPLY_TIMEOUT) == v
            assert off.slot_bytes <= 2 * N
        assert off.slots_lent(peer) <= 2
        want = [(v, v) for v in range(1, 6)]
        assert keeper.ranges.call_one().get(timeout=REPLY_TIMEOUT) == want
        keeper.drop.call_one().get(timeout=REPLY_TIMEOUT)
        _wait_returned(peer)


def _calls(loop: Any) -> OffloadCalls:
    """What an offloader is handed, for one that only copies (nothing else is called)."""

    def unused(*args: Any) -> Any:
        raise AssertionError("not called by these tests")

    return OffloadCalls(
        loop=loop,
        me=lambda: ProcId("me", "unix:/nowhere"),
        register=lambda kind, fn: None,
        on_peer_lost=lambda cb: None,
        dispatch=unused,
        send=unused,
        port=unused,
        bounce=unused,
        undeliverable=unused,
        notify_room=lambda: None,
    )


def test_a_receiver_that_cannot_read_the_sender_returns_every_slot_of_the_frame() -> None:
    """The copy fails before any slot is mapped (here: the sender's pid is unknown):
    the frame is refused, and all its slots go back to the sender at once, not only
    those the receiver got to (else the sender counts them lent until it loses us)."""
    handed: list[tuple[Any, ...]] = []
    loop = SimpleNamespace(call_soon_threadsafe=lambda fn, *args: handed.append(args))
    off = Offloader(_calls(loop))
    conn = SimpleNamespace(peer=ProcId("sender", "unix:/nowhere"), peer_pid=None)
    descs = ((0, 1000, N, 7, 11), (1, 2000, N), (2, 3000, N, 8, 12))
    msg = Message(Kind.OFFLOAD, Offload(1, descs, (0,)), b"", [b"", b"", b""])
    assert off._copy_one(conn, msg, None)  # type: ignore[arg-type]
    [(_conn, _msg, _hold, _buffers, error, returned)] = handed
    assert error is not None and "did not say its pid" in error
    assert returned == [11, 12]


def test_a_peer_lost_while_its_frame_is_copied_leaves_no_slot_half_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loss (I/O thread) closes the slots lent to the peer, among them one a sender
    thread is still copying a frame into; the sender then sends the bytes instead. The
    loss raised (a mapping with a view exported cannot be closed) and left the slot
    lent, and the sender put it back among the free ones: evicted later, its
    descriptor number would have been closed a second time, whatever file had that
    number by then. Now the sender closes it, once."""
    from danaus._runtime.messaging import offload

    off = Offloader(_calls(None))
    if not off.shared:
        pytest.skip("no memfd_create here: no shared slots")
    off.ok_peers.add("peer")
    address = offload.vm.address
    lost: list[bool] = []

    def address_then_lose(view: Any) -> int:
        if not lost:  # after the copy, before the sender takes the lock: the I/O thread
            lost.append(True)
            off._on_lost("peer", "gone during the copy")
        return address(view)  # type: ignore[no-any-return]

    monkeypatch.setattr(offload.vm, "address", address_then_lose)
    data = np.arange(N, dtype=np.uint8)
    header, bufs, _ = off.wrap("peer", (0,), [data])
    assert header == (0,) and bufs[0] is data  # the bytes go as they are
    assert off.slots_made == 1
    assert not any(off._slots.values()), "a slot the loss took was put back among the free"
    assert off.slots_lent("peer") == 0 and off.slot_bytes == 0
    monkeypatch.setattr(offload.vm, "address", address)
    off.ok_peers.add("peer")  # a new peer of that name: a fresh slot
    header, _, _ = off.wrap("peer", (0,), [data])
    assert header != (0,) and off.slots_made == 2


def test_a_large_snapshot_is_copied_with_the_gil_released(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sender copying a large frame into a slot (or a private snapshot) goes through the
    chunked copy that releases the GIL: one memoryview assignment of 1 GiB held the GIL
    long enough on a loaded host that the proc's I/O thread missed its heartbeats and the
    client declared the proc frozen."""
    from danaus._runtime.messaging import offload

    copies: list[int] = []
    memmove = offload.vm.memmove

    def recorded(dst: int, src: int, n: int, **kw: Any) -> bool:
        copies.append(n)
        return memmove(dst, src, n, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(offload.vm, "memmove", recorded)
    off = Offloader(_calls(None))
    off.ok_peers.add("peer")
    data = np.arange(N, dtype=np.uint8)
    off.wrap("peer", (0,), [data])
    assert copies == [N]
    if off._lent:  # a shared slot holds the copy
        [(_, slot)] = off._lent.values()
        copy = memoryview(slot.map)[:N]
    else:  # a private snapshot does
        [(_, [copy], _)] = off._held.values()
    assert bytes(copy) == data.tobytes()
