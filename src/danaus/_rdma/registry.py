"""The node's registered memory, and the runtime handlers that answer for it.

A buffer's owner keeps ``id -> Registration`` here until ``drop()``. Other
processes ask the owner's *runtime* (its I/O thread, never an actor thread)
whether their handles are still good, just before each transfer:

    reader --RDMA_CHECK(ids, port, 0)--> owner   I/O thread looks the ids up
    owner  --REPLY(port, 0, [None | why, ...])--> reader
    anyone --RDMA_DROP(ids, port, 0)--> owner    forgets the ids (the data is released)
    owner  --REPLY(port, 0, None)--> anyone

Across hosts the owner's data threads look the ids up here too (``net.py``,
which also answers ``RDMA_DATA``: where its data server listens).

All of it is a part of the node (`BufferRegistry`): a client that
ends its session (``shutdown_context()``) and starts again starts with no
registrations. Buffer ids count up from 1 on each node and are never reused,
so a handle to a dropped buffer can never name a later one (a handle names
its owner's proc too, which is new with each node).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import _config as config
from .._runtime.messaging.runtime import STATUS_OK, Runtime
from .._runtime.node import Node
from .._transport.conn import Connection
from .._wire.protocol import Kind, Message
from .memory import LocalMemory

__all__ = ["BufferRegistry", "Registration", "install"]

log = logging.getLogger("danaus.rdma")


class Registration:
    """Registered memory: where it is, the object that keeps it alive, and its pins."""

    __slots__ = ("addr", "leases", "memory", "nbytes", "on_free", "readonly", "waiters")

    def __init__(self, memory: LocalMemory, on_free: Callable[[], None] | None = None) -> None:
        self.memory = memory
        self.addr = memory.addr
        self.nbytes = memory.nbytes
        self.readonly = memory.readonly
        self.leases = 0  # transfers under way with this memory (each pins it)
        self.waiters: list[Callable[[], None]] = []  # drops waiting for the pins to go
        # Called once, when the memory is no longer held (dropped and unpinned): ends
        # its registration with the backend that moves it (NIXL deregisters it).
        self.on_free = on_free

    def free(self) -> None:
        """The memory is no longer held: end its backend registration (once)."""
        fn, self.on_free = self.on_free, None
        if fn is not None:
            try:
                fn()
            except Exception as e:  # the backend failed: the memory is released anyway
                log.warning("ending the backend registration of a dropped buffer failed: %s", e)


class _Lease:
    __slots__ = ("holder", "regs", "timer")

    def __init__(self, regs: list[Registration], holder: str | None) -> None:
        self.regs = regs
        self.holder = holder  # the proc doing the transfer (None: this process)
        self.timer: Any = None  # expiry (leases held by another proc)


class BufferRegistry:
    """The node's part for registered memory: the buffers registered here and their leases.

    Ended with the node (``shutdown_context()``): its registrations and leases
    are forgotten (drops waiting for a lease complete), so a client that starts
    again begins with none, and a handle to a buffer of the old session is
    refused rather than served from memory that is no longer held.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the registrations, the leases and their ids
        self._next_id = 1  # ids count up and are never reused
        self._registered: dict[int, Registration] = {}
        self._leases: dict[int, _Lease] = {}
        self._next_lease = 1
        self._ended = False

    def register(self, memory: LocalMemory, on_free: Callable[[], None] | None = None) -> int:
        """Keep ``memory`` alive and reachable under a new id; returns the id.

        ``on_free()`` is called once the memory is no longer held (see `Registration`).
        """
        with self._lock:
            buffer_id = self._next_id
            self._next_id += 1
            if not self._ended:
                self._registered[buffer_id] = Registration(memory, on_free)
                on_free = None
        if on_free is not None:  # the node ended: nothing holds the memory
            on_free()
        return buffer_id

    def check(self, buffer_id: int, addr: int, nbytes: int) -> str | None:
        """None if ``buffer_id`` is registered here as ``(addr, nbytes)``, else why not."""
        with self._lock:
            return self._lookup_locked(buffer_id, addr, nbytes)[1]

    def _lookup_locked(
        self, buffer_id: int, addr: int, nbytes: int
    ) -> tuple[Registration | None, str | None]:
        reg = self._registered.get(buffer_id)
        if reg is None:
            if self._ended:
                return None, "its owner's session ended (shutdown_context)"
            return None, "it was dropped" if buffer_id < self._next_id else "it is not registered"
        if reg.addr != addr or reg.nbytes != nbytes:  # pragma: no cover - ids are never reused
            return None, "its registration does not match the handle"
        return reg, None

    def lease(
        self, entries: Any, holder: str | None = None
    ) -> tuple[list[str | None], int | None, list[Registration]]:
        """Check ``entries`` ``(id, addr, nbytes)`` and, if all are good, pin them.

        Returns ``(answers, lease, registrations)``: one ``None`` or reason per
        entry, and a lease id when every answer is ``None``. Until
        `release()` (lease), a `drop()` of any of them waits and their
        memory stays alive.
        """
        with self._lock:
            found = [self._lookup_locked(*entry) for entry in entries]
            answers = [why for _, why in found]
            if any(why is not None for why in answers):
                return answers, None, []
            regs = [reg for reg, _ in found if reg is not None]
            lease_id = self._next_lease
            self._next_lease += 1
            for reg in regs:
                reg.leases += 1
            self._leases[lease_id] = _Lease(regs, holder)
        return answers, lease_id, regs

    def release(self, lease_id: int | None) -> None:
        """End a lease (unknown ids are ignored); drops waiting for it may complete."""
        if lease_id is None:
            return
        with self._lock:
            held = self._leases.pop(lease_id, None)
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

    def release_holder(self, holder: str) -> list[int]:
        """End every lease held by proc ``holder`` (it is lost); returns their ids."""
        with self._lock:
            ids = [i for i, held in self._leases.items() if held.holder == holder]
        for lease_id in ids:
            self.release(lease_id)
        return ids

    def drop(self, buffer_ids: list[int]) -> concurrent.futures.Future[None]:
        """Forget ``buffer_ids`` (unknown ids are ignored): later transfers fail at once.

        Transfers already under way (leases) keep the memory alive and finish
        first: the returned future completes when the last of them has ended,
        and only then is the memory no longer held.
        """
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        lock = self._lock
        freed = []
        with lock:
            pinned = []
            for buffer_id in buffer_ids:
                reg = self._registered.pop(buffer_id, None)
                if reg is not None and reg.leases:
                    pinned.append(reg)
                elif reg is not None:
                    freed.append(reg)
            left = [len(pinned)]

            def one_gone() -> None:
                with lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    done.set_result(None)

            for reg in pinned:
                reg.waiters += [reg.free, one_gone]
        for reg in freed:
            reg.free()
        if not pinned:
            done.set_result(None)
        return done

    def registered_buffers(self) -> list[dict[str, Any]]:
        """The buffers registered here, as plain data (for STATS snapshots and the dashboard)."""
        with self._lock:
            regs = list(self._registered.items())
        return [{"id": i, "nbytes": r.nbytes, "readonly": r.readonly} for i, r in regs]

    def leases(self) -> int:
        """How many leases are held (for inspection)."""
        with self._lock:
            return len(self._leases)

    def on_node_end(self) -> None:
        """Forget every registration and lease; drops that waited for a lease complete."""
        ready: list[Callable[[], None]] = []
        with self._lock:
            self._ended = True
            registered = list(self._registered.values())
            self._registered.clear()
            held, self._leases = list(self._leases.values()), {}
            for reg in {id(r): r for lease in held for r in lease.regs}.values():
                reg.leases = 0
                ready += reg.waiters
                reg.waiters = []
            ready += [reg.free for reg in registered]
        # Their expiry timers die with the node's loop (a timer that still fires finds
        # no lease); cancelling them here would touch the loop from another thread.
        for cb in ready:
            cb()

    # -- the runtime side: answered on the I/O thread --

    def _holder_lost(self, name: str, reason: str) -> None:
        """A proc is lost: the transfers it was doing with our buffers are over."""
        self.release_holder(name)

    def _on_check(self, rt: Runtime, conn: Connection, frame: Message) -> None:
        """Check and pin the buffers another proc of this host is about to copy (I/O thread).

        The pin lasts until its RDMA_RELEASE, the holder's loss, or
        ``rdma_lease_grace`` past the transfer's own deadline (a monotonic time:
        the holder is on this host, whose monotonic clock we share).
        """
        entries, port, index, deadline = frame.header
        holder = conn.peer.name if conn.peer is not None else None
        answers, lease_id, _ = self.lease(entries, holder)
        if lease_id is not None:
            # A deadline below zero is minus the seconds left: sent by a holder on another
            # host (the NIXL backend), whose monotonic clock is not ours.
            left = -float(deadline) if deadline < 0 else float(deadline) - time.monotonic()
            delay = max(0.0, left) + config.get("rdma_lease_grace")
            timer = rt.loop.call_later(delay, self._expire, lease_id)
            with self._lock:
                held = self._leases.get(lease_id)
                if held is not None:
                    held.timer = timer
        rt.reply(port, index, STATUS_OK, (answers, lease_id))

    def _expire(self, lease_id: int) -> None:
        with self._lock:
            held = self._leases.get(lease_id)
            if held is None:
                return
            held.timer = None
        log.warning(
            "an RDMA transfer by proc %s outlived its deadline without ending; its pin on "
            "the buffer is released",
            held.holder,
        )
        self.release(lease_id)

    def _on_release(self, frame: Message) -> None:
        for lease_id in frame.header.leases:
            self.release(lease_id)

    def _on_drop(self, rt: Runtime, frame: Message) -> None:
        buffer_ids, port, index = frame.header
        done = self.drop(list(buffer_ids))
        if port is not None:
            # Answered once the transfers under way have ended (the memory is then free).
            done.add_done_callback(lambda _: rt.reply(port, index, STATUS_OK, None))


# -- installing the handlers on a runtime -----------------------------------------------


def install(node: Node, boot: dict[str, Any] | None = None) -> None:
    """Register the registry's frame handlers on ``node``'s runtime (idempotent).

    ``net.install`` calls this, then adds the data plane's: it is the RDMA installer.
    """
    rt = node.runtime
    if rt.handlers.get(Kind.RDMA_CHECK) is None:
        reg = node.part(BufferRegistry)
        rt.register(Kind.RDMA_CHECK, lambda conn, msg: reg._on_check(rt, conn, msg))
        rt.register(Kind.RDMA_DROP, lambda conn, msg: reg._on_drop(rt, msg))
        rt.observing.observers["rdma"] = reg.registered_buffers
        rt.register(Kind.RDMA_RELEASE, lambda conn, msg: reg._on_release(msg))
        rt.peers.lost_callbacks.append(reg._holder_lost)
