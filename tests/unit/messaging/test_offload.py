"""The offloader's shared snapshot slots, in one process with stand-in calls: a frame
the receiver cannot copy gives back every slot, a peer lost mid-copy leaves no slot half
closed, and a large snapshot is copied in GIL-releasing chunks. Arrays offloaded between
real procs: ``tests/integration/test_shared_slots.py``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from danaus._runtime.messaging.faces import OffloadCalls
from danaus._runtime.messaging.offload import Offloader
from danaus._wire.ids import ProcId
from danaus._wire.protocol import Kind, Message, Offload

MiB = 1 << 20
N = 4 * MiB


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
