"""This process's registered memory, and the runtime handlers that answer for it.

A buffer's owner keeps ``id -> Registration`` here until ``drop()``. Other
processes ask the owner's *runtime* (its I/O thread, never an actor thread)
whether their handles are still good, just before each transfer::

    reader --RDMA_CHECK(ids, port, 0)--> owner   I/O thread looks the ids up
    owner  --REPLY(port, 0, [None | why, ...])--> reader
    anyone --RDMA_DROP(ids, port, 0)--> owner    forgets the ids (the data is released)
    owner  --REPLY(port, 0, None)--> anyone

Across hosts the owner's data threads look the ids up here too (``net.py``,
which also answers ``RDMA_DATA``: where its data server listens).

Buffer ids count up from 1 in each process and are never reused, so a
handle to a dropped buffer can never name a later one.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _config as config
from .._runtime.node import Node
from .._runtime.runtime import STATUS_OK, Runtime
from .._transport.conn import Connection
from .._wire.protocol import Kind, Message
from .memory import LocalMemory

__all__ = [
    "Registration",
    "check",
    "drop",
    "install",
    "lease",
    "register",
    "release",
]

log = logging.getLogger("danaus.rdma")


class Registration:
    """Registered memory: where it is, the object that keeps it alive, and its pins."""

    __slots__ = ("addr", "leases", "memory", "nbytes", "readonly", "waiters")

    def __init__(self, memory: LocalMemory) -> None:
        self.memory = memory
        self.addr = memory.addr
        self.nbytes = memory.nbytes
        self.readonly = memory.readonly
        self.leases = 0  # transfers under way with this memory (each pins it)
        self.waiters: list[Callable[[], None]] = []  # drops waiting for the pins to go


class _Lease:
    __slots__ = ("holder", "regs", "timer")

    def __init__(self, regs: list[Registration], holder: str | None) -> None:
        self.regs = regs
        self.holder = holder  # the proc doing the transfer (None: this process)
        self.timer: Any = None  # expiry (leases held by another proc)


_lock = threading.Lock()
_next_id = 1  # ids count up and are never reused
_registered: dict[int, Registration] = {}
_leases: dict[int, _Lease] = {}
_next_lease = 1


def register(memory: LocalMemory) -> int:
    """Keep ``memory`` alive and reachable under a new id; returns the id."""
    global _next_id
    with _lock:
        buffer_id = _next_id
        _next_id += 1
        _registered[buffer_id] = Registration(memory)
    return buffer_id


def check(buffer_id: int, addr: int, nbytes: int) -> str | None:
    """None if ``buffer_id`` is registered here as ``(addr, nbytes)``, else why not."""
    with _lock:
        return _lookup_locked(buffer_id, addr, nbytes)[1]


def _lookup_locked(
    buffer_id: int, addr: int, nbytes: int
) -> tuple[Registration | None, str | None]:
    reg = _registered.get(buffer_id)
    if reg is None:
        return None, "it was dropped" if buffer_id < _next_id else "it is not registered"
    if reg.addr != addr or reg.nbytes != nbytes:  # pragma: no cover - ids are never reused
        return None, "its registration does not match the handle"
    return reg, None


def lease(
    entries: Any, holder: str | None = None
) -> tuple[list[str | None], int | None, list[Registration]]:
    """Check ``entries`` ``(id, addr, nbytes)`` and, if all are good, pin them.

    Returns ``(answers, lease, registrations)``: one ``None`` or reason per
    entry, and a lease id when every answer is ``None``. Until
    :func:`release` (lease), a :func:`drop` of any of them waits and their
    memory stays alive.
    """
    global _next_lease
    with _lock:
        found = [_lookup_locked(*entry) for entry in entries]
        answers = [why for _, why in found]
        if any(why is not None for why in answers):
            return answers, None, []
        regs = [reg for reg, _ in found if reg is not None]
        lease_id = _next_lease
        _next_lease += 1
        for reg in regs:
            reg.leases += 1
        _leases[lease_id] = _Lease(regs, holder)
    return answers, lease_id, regs


def release(lease_id: int | None) -> None:
    """End a lease (unknown ids are ignored); drops waiting for it may complete."""
    if lease_id is None:
        return
    with _lock:
        held = _leases.pop(lease_id, None)
        if held is None:
            return
        ready: list[Callable[[], None]] = []
        for reg in held.regs:
            reg.leases -= 1
            if reg.leases == 0:
                ready += reg.waiters
                reg.waiters = []
    if held.timer is not None:
        held.timer.cancel()
    for cb in ready:
        cb()


def release_holder(holder: str) -> list[int]:
    """End every lease held by proc ``holder`` (it is lost); returns their ids."""
    with _lock:
        ids = [i for i, held in _leases.items() if held.holder == holder]
    for lease_id in ids:
        release(lease_id)
    return ids


def drop(buffer_ids: list[int]) -> concurrent.futures.Future[None]:
    """Forget ``buffer_ids`` (unknown ids are ignored): later transfers fail at once.

    Transfers already under way (leases) keep the memory alive and finish
    first: the returned future completes when the last of them has ended,
    and only then is the memory no longer held.
    """
    done: concurrent.futures.Future[None] = concurrent.futures.Future()
    with _lock:
        pinned = []
        for buffer_id in buffer_ids:
            reg = _registered.pop(buffer_id, None)
            if reg is not None and reg.leases:
                pinned.append(reg)
        left = [len(pinned)]

        def one_gone() -> None:
            with _lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                done.set_result(None)

        for reg in pinned:
            reg.waiters.append(one_gone)
    if not pinned:
        done.set_result(None)
    return done


def registered_buffers() -> list[dict[str, Any]]:
    """The buffers registered here, as plain data (for STATS snapshots and the dashboard)."""
    with _lock:
        regs = list(_registered.items())
    return [{"id": i, "nbytes": r.nbytes, "readonly": r.readonly} for i, r in regs]


# -- the runtime side: answered on the I/O thread ----------------------------------


def install(node: Node, boot: dict[str, Any] | None = None) -> None:
    """Register the RDMA frame handlers on ``node``'s runtime (idempotent)."""
    rt = node.runtime
    if rt.handlers.get(Kind.RDMA_CHECK) is None:
        rt.register(Kind.RDMA_CHECK, lambda conn, msg: _on_check(rt, conn, msg))
        rt.register(Kind.RDMA_DROP, lambda conn, msg: _on_drop(rt, msg))
        rt.observers["rdma"] = registered_buffers
        rt.register(Kind.RDMA_RELEASE, lambda conn, msg: _on_release(msg))
        rt.lost_callbacks.append(_holder_lost)
    from . import net  # here, not at the top: net imports this module

    net.install(rt)


def _holder_lost(name: str, reason: str) -> None:
    """A proc is lost: the transfers it was doing with our buffers are over."""
    release_holder(name)


def _on_check(rt: Runtime, conn: Connection, frame: Message) -> None:
    """Check and pin the buffers another proc of this host is about to copy (I/O thread).

    The pin lasts until its RDMA_RELEASE, the holder's loss, or
    ``rdma_lease_grace`` past the transfer's own deadline (a monotonic time:
    the holder is on this host, whose monotonic clock we share).
    """
    entries, port, index, deadline = frame.header
    holder = conn.peer.name if conn.peer is not None else None
    answers, lease_id, _ = lease(entries, holder)
    if lease_id is not None:
        delay = max(0.0, float(deadline) - time.monotonic()) + config.get("rdma_lease_grace")
        timer = rt.loop.call_later(delay, _expire, lease_id)
        with _lock:
            held = _leases.get(lease_id)
            if held is not None:
                held.timer = timer
    rt.reply(port, index, STATUS_OK, (answers, lease_id))


def _expire(lease_id: int) -> None:
    with _lock:
        held = _leases.get(lease_id)
        if held is None:
            return
        held.timer = None
    log.warning(
        "an RDMA transfer by proc %s outlived its deadline without ending; its pin on "
        "the buffer is released",
        held.holder,
    )
    release(lease_id)


def _on_release(frame: Message) -> None:
    for lease_id in frame.header.leases:
        release(lease_id)


def _on_drop(rt: Runtime, frame: Message) -> None:
    buffer_ids, port, index = frame.header
    done = drop(list(buffer_ids))
    if port is not None:
        # Answered once the transfers under way have ended (the memory is then free).
        done.add_done_callback(lambda _: rt.reply(port, index, STATUS_OK, None))
