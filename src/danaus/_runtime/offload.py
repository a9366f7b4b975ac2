"""Large message buffers between procs of one host skip the socket: the receiver copies
them straight out of the sender's memory (one copy instead of two).

::

    A --HELLO(pid, host key, probe)--> B      B tries to read A's probe bytes with
    A <--OFFLOAD_OK-------------------- B      process_vm_readv; if it can, A may offload
    A --OFFLOAD(token, [(i, addr, n)], inner header) + small buffers--> B
                                               B reads each big buffer from A's memory
    A <--RELEASE(token)---------------- B      ... and A lets go of them

The wrapped frame travels on the same connection as every other frame, so
order is kept. The receiver copies off the I/O thread (a copier thread: a
large buffer must not stall heartbeats and other connections); meanwhile it
stops reading that connection, so the frames behind it wait their turn. The
sender copies each big buffer once, at send time, into a mapping of its own
that it holds until RELEASE (or until the receiver is lost): the receiver
gets what was passed, even if the caller changes its array right after
``call()`` returns.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import TYPE_CHECKING, Any

from .. import _config as config
from .._transport import vm
from .._wire.frame import Frame, alloc, flat, recv_pool
from .._wire.protocol import (
    Kind,
    Message,
    Offload,
    OffloadOk,
    ProtocolError,
    Release,
    Reply,
    decode_header,
    wire,
)

if TYPE_CHECKING:
    from .._transport.conn import Connection
    from .runtime import Runtime

__all__ = ["Offloader"]

log = logging.getLogger("danaus.runtime")


_PROBE = bytearray(b"danaus offload probe \x01\x02\x03")
_probe_addr: int | None = None


def _probe() -> tuple[int, int]:
    global _probe_addr
    if _probe_addr is None:
        _probe_addr = vm.address(memoryview(_PROBE))
    return _probe_addr, len(_PROBE)


def _size(copies: Any) -> int:
    return sum(len(c) for c in copies)


def _bucket(n: int) -> int:
    return 1 << max(20, (n - 1).bit_length())  # powers of two from 1 MiB


class Offloader:
    """The offload state of one runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.min = config.get("offload_min")  # bytes; 0 disables
        self.enabled = self.min > 0 and vm.available()
        self.ok_peers: set[str] = set()  # peers that can read our memory
        self._held: dict[int, tuple[str, list[Any]]] = {}
        self._held_bytes: dict[str, int] = {}  # peer -> bytes of its unreleased snapshots
        self._next = 0
        self._lock = threading.Lock()
        self._pool: dict[int, list[Any]] = {}  # bucket size -> free snapshot mappings
        self._pooled = 0
        # Copies of received buffers, done by a thread of their own (started on first use).
        self._copies: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._copier: threading.Thread | None = None
        self.copied_off_loop = 0  # bytes the copier thread read out of senders (a statistic)
        rt.register(Kind.OFFLOAD, self._on_offload)
        rt.register(Kind.OFFLOAD_OK, self._on_ok)
        rt.register(Kind.RELEASE, self._on_release)
        rt.lost_callbacks.append(self._on_lost)

    def hello_extra(self) -> tuple[Any, ...]:
        if not self.enabled:
            return ()
        addr, n = _probe()
        return (os.getpid(), vm.host_key(), addr, n)

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
            self.rt.send(conn.peer, OffloadOk(self.rt.proc_id.name), on_fail=lambda r: None)

    def _on_ok(self, conn: Connection, msg: Message) -> None:
        self.ok_peers.add(msg.header.name)

    def wrap(self, peer: str, header: tuple[Any, ...], buffers: Any) -> tuple[tuple[Any, ...], Any]:
        """Replace the big buffers of a frame to ``peer`` by descriptors, if worthwhile.

        ``header`` is a wire tuple; so is the ``OFFLOAD`` header returned."""
        if peer not in self.ok_peers:
            return header, buffers
        raws = [flat(b) for b in buffers]
        big = [i for i, r in enumerate(raws) if len(r) >= self.min]
        if not big:
            return header, buffers
        # The receiver reads later, and the caller may change its arrays as soon as
        # this returns: it reads a snapshot, one copy into a mapping of our own.
        copies = {
            i: raws[i] if isinstance(raws[i], bytes) else self._snapshot(raws[i]) for i in big
        }
        descs = [(i, vm.address(memoryview(copies[i])), len(raws[i])) for i in big]
        with self._lock:
            if peer not in self.ok_peers:  # lost meanwhile: send the bytes instead
                return header, buffers
            self._next += 1
            token = self._next
            self._held[token] = (peer, list(copies.values()))
            self._held_bytes[peer] = self._held_bytes.get(peer, 0) + _size(copies.values())
        small = [b"" if i in set(big) else r for i, r in enumerate(raws)]
        return wire(Offload(token, tuple(descs), header)), small

    def _snapshot(self, raw: Any) -> Any:
        """A private copy of ``raw``, in a mapping reused from the pool when one fits."""
        size = _bucket(len(raw))
        with self._lock:
            free = self._pool.get(size)
            mapping = free.pop() if free else None
            if mapping is not None:
                self._pooled -= size
        if mapping is None:
            mapping = alloc(size)
        view = memoryview(mapping)[: len(raw)]
        view[:] = raw
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

    def held_bytes(self, peer: str) -> int:
        """Bytes offloaded to ``peer`` that it has not released yet (what we hold for it)."""
        return self._held_bytes.get(peer, 0)

    def _on_release(self, conn: Connection, msg: Message) -> None:
        with self._lock:
            held = self._held.pop(msg.header.token, None)
            if held is not None:
                peer, copies = held
                left = self._held_bytes.get(peer, 0) - _size(copies)
                if left > 0:
                    self._held_bytes[peer] = left
                else:
                    self._held_bytes.pop(peer, None)
                self._recycle(copies)
        if held is not None:
            self.rt.notify_room()

    def _on_lost(self, name: str, reason: str) -> None:
        with self._lock:
            self.ok_peers.discard(name)
            for token in [t for t, (p, _) in self._held.items() if p == name]:
                del self._held[token]  # not reused: a lost reader might still be reading
            self._held_bytes.pop(name, None)

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
            conn, msg, hold = self._copies.get()
            descs = msg.header.descs
            buffers = list(msg.buffers)
            pid = getattr(conn, "peer_pid", None)
            error = None
            try:
                if pid is None:
                    raise OSError("the sender did not say its pid")
                for i, addr, n in descs:
                    # Warm memory when some is free (no page faults), else a fresh
                    # pre-faulted mapping; never a bytearray (a zero-fill pass first).
                    buf = recv_pool.take(n)
                    vm.copy(pid, vm.address(buf), addr, n, write=False)
                    buffers[i] = buf
                    self.copied_off_loop += n
            except (OSError, MemoryError, ValueError) as e:
                error = f"reading a large buffer from the sender failed: {e}"
            try:
                self.rt.loop.call_soon_threadsafe(self._copied, conn, msg, hold, buffers, error)
            except RuntimeError:  # the loop is closed: the runtime is gone
                return

    def _copied(
        self, conn: Connection, msg: Message, hold: Any, buffers: list[Any], error: str | None
    ) -> None:
        """Back on the I/O thread: release the sender's copy, deliver, read on."""
        token, _descs, inner = msg.header
        try:
            if conn.peer is not None:
                self.rt.send(conn.peer, Release(token), on_fail=lambda r: None)
            if error is not None:
                self._undelivered(conn, inner, error)
            elif not conn.closed:
                self.rt._dispatch(conn, Frame(inner, msg.body, buffers))
        finally:
            conn.resume(hold)

    def _undelivered(self, conn: Connection, inner: tuple[Any, ...], reason: str) -> None:
        """The frame cannot be rebuilt: whoever waits for it hears why (never silence)."""
        from .._errors import SupervisionError
        from .._wire import codec
        from .runtime import STATUS_ERROR

        log.error("a message from %s could not be received: %s", conn.peer, reason)
        try:
            kind, header = decode_header(inner)
        except ProtocolError:
            return
        if kind == Kind.CALL and header.port is not None:
            self.rt.undeliverable(header.port, header.slot, reason)
        elif kind == Kind.REPLY:
            handler = self.rt.ports.get(header.port)
            if handler is not None:
                body, _ = codec.dumps(
                    SupervisionError(f"a reply was lost: {reason}", reason=reason)
                )
                lost = Reply(header.port, header.slot, STATUS_ERROR)
                handler.deliver(Message(Kind.REPLY, lost, memoryview(body), []))
            elif header.sender is not None:
                self.rt.bounce(header.sender, f"port {header.port}", reason)
