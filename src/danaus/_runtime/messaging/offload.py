"""Large message buffers between procs of one host skip the socket: the receiver copies
them straight out of the sender's memory (one copy instead of two).

::

    A --HELLO(pid, host key, probe)--> B      B tries to read A's probe bytes with
    A <--OFFLOAD_OK-------------------- B      process_vm_readv; if it can, A may offload
    A --OFFLOAD(token, [(i, addr, n)], inner header) + small buffers--> B
                                               B reads each big buffer from A's memory
    A <--RELEASE(token)---------------- B      ... and A lets go of them

The sender's copy lies in a *shared slot* when it can (a memfd mapping kept warm
for reuse): the receiver then maps that copy instead of copying it again
(``/proc/<pid>/fd/<n>``, private and copy-on-write, so it may write to its
arrays), hands the mapping to the message's consumer, and once nothing refers
to it any more sends RETURN, after which the sender reuses the slot. One copy
in all instead of two. Otherwise (no slot free within ``snapshot_pool``, or
the receiver cannot open the sender's descriptors) the receiver copies as
described below, into warm receive memory (``recv_pool``).

The wrapped frame travels on the same connection as every other frame, so
order is kept. The receiver copies off the I/O thread (a copier thread: a
large buffer must not stall heartbeats and other connections); meanwhile it
stops reading that connection, so the frames behind it wait their turn. The
sender copies each big buffer once, at send time, into a mapping of its own
that it holds until RELEASE (or until the receiver is lost): the receiver
gets what was passed, even if the caller changes its array right after
``call()`` returns. A large message (above ``send_snapshot_max``, or beyond
the staging budget) is *lent* instead: the descriptors point at the caller's
own buffers, and the sending thread waits for RELEASE (``wrap(lend=True)``),
so the promise holds without the copy.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import mmap
import os
import queue
import threading
import weakref
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._errors import SupervisionError
from ..._transport import vm
from ..._wire import codec
from ..._wire.frame import Frame, alloc, flat, recv_pool
from ..._wire.protocol import (
    STATUS_ERROR,
    Kind,
    Message,
    Offload,
    OffloadOk,
    Release,
    Reply,
    Return,
    decode_header,
    wire,
)
from .faces import OffloadCalls
from .offload_memory import Held, Slot, bucket, copy_into, own, size_of

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Sequence

    from _typeshed import ReadableBuffer

    from ..._transport.conn import Connection
    from ..._wire.ids import ProcId

__all__ = ["Offloader", "own"]  # own: from offload_memory, named here for its callers

log = logging.getLogger("danaus.runtime")


# Bytes a peer on this host reads out of this process's memory to learn that it can
# (a constant: never resized, so its address holds for the life of the process).
_PROBE = bytearray(b"danaus offload probe \x01\x02\x03")


_SPLIT_MIN = 32 << 20  # a buffer at least this large is read in parts, on several threads
_READERS = 4  # ... at most this many at once


_SHARED = hasattr(os, "memfd_create") and hasattr(mmap, "MAP_SHARED")


class Offloader:
    """The offload state of one runtime."""

    def __init__(self, calls: OffloadCalls) -> None:
        self.calls = calls
        self.min = config.get("offload_min")  # bytes; 0 disables
        self.enabled = self.min > 0 and vm.available()
        self.ok_peers: set[str] = set()  # peers that can read our memory
        self._held: dict[int, Held] = {}  # token -> what it holds
        self._held_bytes: dict[str, int] = {}  # peer -> bytes of its unreleased snapshots
        # held_of(peer, 0): those bytes, a C-level lookup for the sender's hot path
        self.held_of: Callable[[str, int], int] = self._held_bytes.get
        self._next = 0
        # Guards the snapshots held for peers and the pools of mappings and shared slots
        # (_held, _held_bytes, _pool, _slots, _lent, _slot_bytes) and ok_peers' losses.
        self._lock = threading.Lock()
        self._pool: dict[int, list[Any]] = {}  # bucket size -> free snapshot mappings
        self._pooled = 0
        # Shared slots (sender side): free ones by size, lent ones (mapped by a receiver
        # or in flight) by uid; all of them together within `snapshot_pool`.
        self._slots: dict[int, list[Slot]] = {}
        self._lent: dict[int, tuple[str, Slot]] = {}
        self._slot_bytes = 0
        self.shared = _SHARED
        self.slots_made = 0  # shared slots created (a statistic: reuse keeps it flat)
        # Receiver side: slots whose mapping died here, to be returned (any thread adds).
        self._returns: collections.deque[tuple[ProcId, int]] = collections.deque()
        self.mapped = 0  # bytes received by mapping a shared slot (a statistic)
        # Copies of received buffers, done by a thread of their own (started on first use).
        self._copies: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._copier: threading.Thread | None = None
        self._readers: concurrent.futures.ThreadPoolExecutor | None = None  # parts of big reads
        self.copied_off_loop = 0  # bytes the copier thread read out of senders (a statistic)
        self._probe_addr: int | None = None  # where _PROBE is (hello_extra finds it on first use)
        calls.register(Kind.OFFLOAD, self._on_offload)
        calls.register(Kind.OFFLOAD_OK, self._on_ok)
        calls.register(Kind.RELEASE, self._on_release)
        calls.register(Kind.RETURN, self._on_return)
        calls.on_peer_lost(self._on_lost)

    def hello_extra(self) -> tuple[Any, ...]:
        if not self.enabled:
            return ()
        if self._probe_addr is None:
            self._probe_addr = vm.address(memoryview(_PROBE))
        return (os.getpid(), vm.host_key(), self._probe_addr, len(_PROBE))

    def on_hello(self, conn: Connection, extra: tuple[Any, ...]) -> None:
        """A proc introduced itself: tell it whether we can read its memory."""
        if not self.enabled or len(extra) < 4:
            return
        pid, key, addr, n = extra[:4]
        conn.peer_pid = pid
        if key != vm.host_key():
            return
        buf = bytearray(n)
        try:
            vm.copy(pid, vm.address(memoryview(buf)), addr, n, write=False)
        except OSError:
            return  # not allowed (ptrace rules): the socket carries everything
        if buf == _PROBE:
            self.calls.send(conn.peer, OffloadOk(self.calls.me().name), on_fail=lambda r: None)

    def _on_ok(self, conn: Connection, msg: Message) -> None:
        self.ok_peers.add(msg.header.name)

    def wrap(
        self,
        peer: str,
        header: tuple[Any, ...],
        buffers: Sequence[ReadableBuffer],
        on_left: Callable[[], None] | None = None,
        *,
        lend: bool = False,
    ) -> tuple[tuple[Any, ...], Sequence[ReadableBuffer], bool]:
        """Replace the big buffers of a frame to ``peer`` by descriptors, if worthwhile.

        ``header`` is a wire tuple; so is the ``OFFLOAD`` header returned. The
        receiver reads a snapshot of each big buffer, or with ``lend`` the buffer
        itself, in place: then the caller must leave it alone until ``on_left()``.
        The last item returned says whether the frame was offloaded, in which case
        ``on_left()`` is called once the receiver has read it (or is lost)."""
        if peer not in self.ok_peers:
            return header, buffers, False
        raws = [flat(b) for b in buffers]
        big = [i for i, r in enumerate(raws) if len(r) >= self.min]
        if not big:
            return header, buffers, False
        if lend:
            return self._lend(peer, header, raws, big, on_left)
        # The receiver reads later, and the caller may change its arrays as soon as
        # this returns: it reads a snapshot, one copy into a shared slot (which the
        # receiver maps) or else into a mapping of our own (which it copies).
        copies: dict[int, Any] = {}
        slots: dict[int, Slot] = {}
        view = None
        for i in big:
            raw = raws[i]
            slot = self._take_slot(peer, len(raw)) if not isinstance(raw, bytes) else None
            if slot is not None:
                view = memoryview(slot.map)[: len(raw)]
                copy_into(view, raw)
                copies[i], slots[i] = view, slot
            else:
                copies[i] = raw if isinstance(raw, bytes) else self._snapshot(raw)
        descs = [
            (i, vm.address(memoryview(copies[i])), len(raws[i]))
            + ((slots[i].fd, slots[i].uid) if i in slots else ())
            for i in big
        ]
        gone: list[Slot] = []
        with self._lock:
            lost = peer not in self.ok_peers
            if lost:  # meanwhile: send the bytes instead
                # A slot still lent goes back to the free ones. The loss took the
                # others, and could not close them while we copied into them: we do.
                for slot in slots.values():
                    if self._lent.pop(slot.uid, None) is not None:
                        self._free_slot(slot)
                    else:
                        gone.append(slot)
            else:
                self._next += 1
                token = self._next
                size = size_of(copies.values())
                mine = [c for i, c in copies.items() if i not in slots]
                self._held[token] = Held(peer, mine, size, on_left, [])
                self._held_bytes[peer] = self._held_bytes.get(peer, 0) + size
        if lost:
            view = None  # no view of a slot left: it can be unmapped
            copies.clear()
            for slot in gone:
                slot.close()
            return header, buffers, False
        small = [b"" if i in set(big) else r for i, r in enumerate(raws)]
        return wire(Offload(token, tuple(descs), header)), small, True

    def _lend(
        self,
        peer: str,
        header: tuple[Any, ...],
        raws: list[bytes | memoryview],
        big: list[int],
        on_left: Callable[[], None] | None,
    ) -> tuple[tuple[Any, ...], Sequence[ReadableBuffer], bool]:
        """``wrap`` without a copy: the receiver reads the caller's buffers in place."""
        descs = [(i, vm.address(memoryview(raws[i])), len(raws[i])) for i in big]
        lent = [raws[i] for i in big]  # alive until released, whatever the caller does
        with self._lock:
            if peer not in self.ok_peers:  # lost meanwhile: send the bytes instead
                return header, raws, False
            self._next += 1
            token = self._next
            size = size_of(lent)
            self._held[token] = Held(peer, [], size, on_left, lent)
            self._held_bytes[peer] = self._held_bytes.get(peer, 0) + size
        small = [b"" if i in set(big) else r for i, r in enumerate(raws)]
        return wire(Offload(token, tuple(descs), header)), small, True

    def _take_slot(self, peer: str, n: int) -> Slot | None:
        """A free shared slot of at least ``n`` bytes, lent to ``peer`` (None if the pool
        has no room for one: the caller falls back to a private snapshot)."""
        if not self.shared:
            return None
        size = bucket(n)
        with self._lock:
            limit = config.get("snapshot_pool")
            if self._slot_bytes > limit:  # the setting was lowered: free slots go first
                self._evict_slots(self._slot_bytes - limit)
            free = self._slots.get(size)
            slot = free.pop() if free else None
            if slot is None:
                if self._slot_bytes + size > limit:
                    self._evict_slots(self._slot_bytes + size - limit)
                if self._slot_bytes + size > limit:
                    return None
                self._next += 1
                uid = self._next
                self._slot_bytes += size  # reserved; made below, outside the lock
            else:
                self._lent[slot.uid] = (peer, slot)
                return slot
        try:
            fd = os.memfd_create("danaus-snapshot", getattr(os, "MFD_CLOEXEC", 0))
            os.ftruncate(fd, size)
            slot = Slot(fd, size, uid)
            self.slots_made += 1
        except (OSError, ValueError) as e:
            log.debug("no shared snapshot slot of %d bytes: %s", size, e)
            with self._lock:
                self._slot_bytes -= size
            return None
        with self._lock:
            self._lent[uid] = (peer, slot)
        return slot

    def _evict_slots(self, want: int) -> None:
        """Close free slots until ``want`` bytes are gone (lock held)."""
        for size in sorted(self._slots, reverse=True):
            free = self._slots[size]
            while free and want > 0:
                slot = free.pop()
                self._slot_bytes -= size
                want -= size
                slot.close()

    def _free_slot(self, slot: Slot) -> None:
        """A slot nobody reads any more goes back to the free slots (lock held)."""
        self._slots.setdefault(slot.size, []).append(slot)

    def _on_return(self, conn: Connection, msg: Message) -> None:
        name = conn.peer.name if conn.peer is not None else None
        with self._lock:
            for uid in msg.header.uids:
                lent = self._lent.get(uid)
                if lent is not None and lent[0] == name:
                    del self._lent[uid]
                    self._free_slot(lent[1])

    def _snapshot(self, raw: bytes | memoryview) -> memoryview:
        """A private copy of ``raw``, in a mapping reused from the pool when one fits."""
        size = bucket(len(raw))
        with self._lock:
            free = self._pool.get(size)
            mapping = free.pop() if free else None
            if mapping is not None:
                self._pooled -= size
        if mapping is None:
            mapping = alloc(size)
        view = memoryview(mapping)[: len(raw)]
        copy_into(view, raw)
        return view

    def _recycle(self, copies: list[Any]) -> None:
        """Snapshots the receiver is done with go back to the pool (lock held)."""
        for view in copies:
            if isinstance(view, bytes):
                continue  # immutable: it was sent as it was, not copied
            mapping = view.obj
            size = len(mapping)
            if self._pooled + size <= config.get("snapshot_pool"):
                self._pool.setdefault(size, []).append(mapping)
                self._pooled += size

    def slots_lent(self, peer: str) -> int:
        """Shared slots ``peer`` has not returned yet (a statistic)."""
        with self._lock:
            return sum(1 for p, _ in self._lent.values() if p == peer)

    @property
    def slot_bytes(self) -> int:
        """Bytes of shared slots, free and lent (at most ``snapshot_pool``)."""
        return self._slot_bytes

    def held_bytes(self, peer: str) -> int:
        """Bytes offloaded to ``peer`` that it has not released yet (what we hold for it)."""
        return self._held_bytes.get(peer, 0)

    def _on_release(self, conn: Connection, msg: Message) -> None:
        with self._lock:
            held = self._held.pop(msg.header.token, None)
            if held is not None:
                left = self._held_bytes.get(held.peer, 0) - held.size
                if left > 0:
                    self._held_bytes[held.peer] = left
                else:
                    self._held_bytes.pop(held.peer, None)
                self._recycle(held.copies)
        if held is not None:
            if held.on_left is not None:
                held.on_left()
            self.calls.notify_room()

    def _on_lost(self, name: str, reason: str) -> None:
        with self._lock:
            self.ok_peers.discard(name)
            # Not reused: a lost reader might still be reading.
            gone = [self._held.pop(t) for t, h in list(self._held.items()) if h.peer == name]
            self._held_bytes.pop(name, None)
            for uid in [u for u, (p, _) in self._lent.items() if p == name]:
                _, slot = self._lent.pop(uid)  # closed, not reused (as above)
                self._slot_bytes -= slot.size
                slot.close()
        for held in gone:
            if held.on_left is not None:
                held.on_left()

    def _on_offload(self, conn: Connection, msg: Message) -> None:
        """Read the big buffers out of the sender, on the copier thread; the connection
        pauses until the frame is rebuilt and delivered, so nothing overtakes it."""
        hold = object()  # what pauses the connection until this frame is delivered
        conn.pause(hold)
        self._copies.put((conn, msg, hold))
        if self._copier is None:
            self._copier = threading.Thread(
                target=self._copy_loop, name="danaus-offload-copy", daemon=True
            )
            self._copier.start()

    def _copy_loop(self) -> None:
        while True:
            # One frame per call: nothing of it stays referenced here while this thread
            # waits for the next (a mapping still referenced is never given back).
            if not self._copy_one(*self._copies.get()):
                return

    def _copy_one(self, conn: Connection, msg: Message, hold: Hashable) -> bool:
        """Read or map the big buffers of one frame, then hand it to the I/O thread;
        False once the runtime is gone."""
        descs = msg.header.descs
        buffers = list(msg.buffers)
        pid = getattr(conn, "peer_pid", None)
        error = None
        mapped: set[int] = set()  # shared slots we mapped; any other goes back (RETURN)
        try:
            if pid is None:
                raise OSError("the sender did not say its pid")
            for desc in descs:
                i, addr, n = desc[:3]
                if len(desc) >= 5:
                    view = self._map_slot(conn.peer, pid, desc[3], desc[4], n)
                    if view is not None:
                        buffers[i] = view
                        mapped.add(desc[4])
                        self.mapped += n
                        self.copied_off_loop += n
                        continue
                # Warm memory when some is free (no page faults), else a fresh
                # pre-faulted mapping; never a bytearray (a zero-fill pass first).
                buf = recv_pool.take(n)
                self._read(pid, vm.address(buf), addr, n)
                buffers[i] = buf
                self.copied_off_loop += n
        except (OSError, MemoryError, ValueError) as e:
            error = f"reading a large buffer from the sender failed: {e}"
        # Slots copied instead of mapped, or not reached after an error: the sender
        # may reuse them at once (else it would count them lent until we are lost).
        copied = [d[4] for d in descs if len(d) >= 5 and d[4] not in mapped]
        try:
            self.calls.loop.call_soon_threadsafe(
                self._copied, conn, msg, hold, buffers, error, copied
            )
        except RuntimeError:  # the loop is closed: the runtime is gone
            return False
        return True

    def _read(self, pid: int, dst: int, addr: int, n: int) -> None:
        """Read ``n`` bytes at ``addr`` of process ``pid`` into ``dst``: a large buffer in
        parts on several threads at once (one thread's copy runs at about half the
        memory bandwidth; the 256 MiB a sender lends run at twice the rate this way)."""
        ways = min(_READERS, os.cpu_count() or 1)
        if n < _SPLIT_MIN or ways < 2:
            vm.copy(pid, dst, addr, n, write=False)
            return
        step = (-(-n // ways) + 4095) & ~4095  # page-aligned parts
        if self._readers is None:
            self._readers = concurrent.futures.ThreadPoolExecutor(
                ways - 1, thread_name_prefix="danaus-offload-read"
            )
        rest = [
            self._readers.submit(
                vm.copy, pid, dst + off, addr + off, min(step, n - off), write=False
            )
            for off in range(step, n, step)
        ]
        try:
            vm.copy(pid, dst, addr, step, write=False)
        finally:
            for f in rest:
                f.result()  # every part stopped touching dst before it is used or freed

    def _map_slot(self, peer: ProcId | None, pid: int, fd: int, uid: int, n: int) -> Any:
        """Map the sender's shared slot (copy-on-write), or None if we cannot."""
        if peer is None or not self.shared:
            return None
        try:
            mine = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        try:
            if os.fstat(mine).st_size < n:
                return None
            mapping = mmap.mmap(
                mine, n, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        except (OSError, ValueError):
            return None
        finally:
            os.close(mine)
        # When the last view of it goes (a frame, an array on it), the slot goes back.
        weakref.finalize(mapping, self._dropped, peer, uid).atexit = False
        return memoryview(mapping)

    def _dropped(self, peer: ProcId, uid: int) -> None:
        """A mapped slot died here (any thread, maybe inside garbage collection): no
        locks, just a note and a wake-up of the I/O thread. Always a wake-up: skipping
        it when notes were already queued could leave this one behind, had the I/O
        thread just emptied the queue (drops are of large buffers: few)."""
        self._returns.append((peer, uid))
        try:
            self.calls.loop.call_soon_threadsafe(self._send_returns)
        except RuntimeError:  # the loop is closed: the runtime is gone
            pass

    def _send_returns(self) -> None:
        by_peer: dict[ProcId, list[int]] = {}
        while self._returns:
            peer, uid = self._returns.popleft()
            by_peer.setdefault(peer, []).append(uid)
        for peer, uids in by_peer.items():
            self.calls.send(peer, Return(tuple(uids)), on_fail=lambda r: None)

    def _copied(
        self,
        conn: Connection,
        msg: Message,
        hold: Hashable,
        buffers: list[Any],
        error: str | None,
        copied: list[int],
    ) -> None:
        """Back on the I/O thread: release the sender's copy, deliver, read on."""
        token, _descs, inner = msg.header
        try:
            if conn.peer is not None:
                self.calls.send(conn.peer, Release(token), on_fail=lambda r: None)
                if copied:
                    self.calls.send(conn.peer, Return(tuple(copied)), on_fail=lambda r: None)
            if error is not None:
                self._undelivered(conn, inner, error)
            elif not conn.closed:
                self.calls.dispatch(conn, Frame(inner, msg.body, buffers))
        finally:
            conn.resume(hold)

    def _undelivered(self, conn: Connection, inner: tuple[Any, ...], reason: str) -> None:
        """The frame cannot be rebuilt: whoever waits for it hears why (never silence)."""
        log.error("a message from %s could not be received: %s", conn.peer, reason)
        try:
            kind, header = decode_header(inner)
        except Exception:  # not a header we can answer: the error above is all there is
            return
        if kind == Kind.CALL and header.port is not None:
            self.calls.undeliverable(header.port, header.slot, reason)
        elif kind == Kind.REPLY:
            handler = self.calls.port(header.port)
            if handler is not None:
                body, _ = codec.dumps(
                    SupervisionError(f"a reply was lost: {reason}", reason=reason)
                )
                lost = Reply(header.port, header.slot, STATUS_ERROR)
                handler.deliver(Message(Kind.REPLY, lost, memoryview(body), []))
            elif header.sender is not None:
                self.calls.bounce(header.sender, f"port {header.port}", reason)
