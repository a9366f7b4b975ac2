"""The sending side of a runtime: a frame from any thread to a peer's connection.

A part of `Runtime` (``rt.sender``;
``rt.send`` is its `Sender.send()`). A frame to a connected peer is written
from the caller's thread (``Connection.send``); one to a peer not connected
yet waits in its queue (a snapshot, or the lent parts of a large message) and
the peer is dialled; one to a lost peer fails at once. Backpressure: a sender
that finds more than ``send_high_water`` held for the peer waits for room
first (never on the I/O thread).

Large messages: a frame whose out-of-band buffers add up to 1 MiB or more
draws a snapshot's worth from the process's staging budget (``staging_max``)
before anything is copied; above ``send_snapshot_max``, or when the budget
has no room, its buffers are lent instead (nothing copied) and the sending
thread waits until they have left (``wait_sent``): read by the receiver
(offload's RELEASE), or written to the kernel (the connection's mark). The
I/O thread never waits: it copies, budget or not.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._errors import SupervisionError
from ..._wire import memory
from ..._wire.frame import encode_frame, encode_pickled
from ..._wire.protocol import wire
from .offload import own
from .peers import _Peer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from _typeshed import ReadableBuffer

    from ..._wire.ids import ProcId

__all__ = ["Sender"]

log = logging.getLogger("danaus.runtime")


# A message whose out-of-band buffers add up to at least this much is large: lent or
# copied within the staging budget (``memory.staging``); smaller ones are copied freely
# (each peer's share is bounded by send_high_water).
_LARGE = 1 << 20


def _large(buffers: Sequence[ReadableBuffer]) -> int:
    """The bytes of ``buffers`` if they make a large message, else 0."""
    n = 0
    for b in buffers:
        n += len(b) if type(b) is bytes else memoryview(b).nbytes
    return n if n >= _LARGE else 0


class _Give:
    """Gives ``n`` bytes back to the staging budget, once."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self) -> None:
        n, self.n = self.n, 0
        if n:
            memory.staging.give(n)


def _fits(peer: _Peer | None, body: bytes | memoryview, buffers: Sequence[ReadableBuffer]) -> bool:
    """Whether a frame of ``body`` and ``buffers`` goes to ``peer``'s socket in one write
    (its ``one_write``), which then beats an offload: the sending thread hands the
    caller's memory to the kernel at once, and the receiver's waiting thread reads it
    itself, where the one-sided copy takes a copier thread and two hops through the
    receiver's I/O thread (a 1 MiB call at 2.7x the wake-ups and CPU, see
    benchmarks/RESULTS.md)."""
    one_write: int = getattr(peer.conn, "one_write", 0) if peer is not None else 0
    if not one_write:
        return False
    n = len(body)
    for b in buffers:
        n += len(b) if type(b) is bytes else memoryview(b).nbytes
    return n < one_write


def _has_large(parts: list[Any]) -> bool:
    """Whether a frame part would take long to copy (``offload.own`` copies it in chunks)."""
    return any(not isinstance(p, bytes) and memoryview(p).nbytes >= memory.SMALL for p in parts)


class Sender:
    """Writes frames to peers (see the module docstring).

    What it is handed: ``peers`` and ``lock``, the runtime's peer table and its
    lock; ``offloading``, the peers that read large buffers out of our memory
    (the offloader's set), ``offloaded(name, 0)`` the bytes they hold and
    ``wrap(...)`` its descriptor-making; ``high()``, ``wait_for_room(peer)`` and
    ``wait_sent(name, event)``, the backpressure's; ``on_io_thread()``,
    ``call_soon(fn, *args)`` and ``connect(peer)`` (dial it, on the I/O thread).
    """

    def __init__(
        self,
        peers: dict[str, _Peer],
        lock: threading.RLock,
        *,
        offloading: set[str],
        offloaded: Callable[[str, int], int],
        wrap: Callable[..., tuple[Any, Any, bool]],
        high: Callable[[], int],
        wait_for_room: Callable[[_Peer], None],
        wait_sent: Callable[[str, threading.Event], None],
        on_io_thread: Callable[[], bool],
        call_soon: Callable[..., None],
        connect: Callable[[_Peer], None],
    ) -> None:
        self._peers = peers
        self._lock = lock
        self._offloading = offloading
        self._offloaded = offloaded
        self._wrap = wrap
        self._high = high
        self._wait_for_room = wait_for_room
        self._wait_sent = wait_sent
        self._on_io_thread = on_io_thread
        self._call_soon = call_soon
        self._connect = connect

    def send(
        self,
        proc: ProcId,
        header: tuple[Any, ...],
        body: bytes | memoryview = b"",
        buffers: Sequence[ReadableBuffer] = (),
        on_fail: Callable[[str], None] | None = None,
        pickled: bytes | None = None,
    ) -> None:
        """Send a frame with typed ``header`` (``danaus._wire.protocol``) to ``proc``,
        from any thread. Blocks (never on the I/O thread) only while this process
        holds more than ``send_high_water`` for ``proc``, and for a large message
        until its buffers have left this process's memory (``send_snapshot_max``).

        If it cannot be delivered (the peer is lost, now or while the frame
        waits for the peer to come up), ``on_fail(reason)`` is called, or
        [`SupervisionError`][danaus.actor.SupervisionError] raised if there is no ``on_fail``.
        ``pickled``, when given, is the pickle of ``wire(header)`` (a caller
        that caches header bytes); it is used unless the frame is offloaded.
        """
        peers = self._peers
        name = proc.name
        peer = peers.get(name)
        if peer is not None:  # what this process holds for the peer (backpressure.outbound)
            conn = peer.conn
            held = peer.queued_bytes if conn is None else peer.queued_bytes + conn.backlog_bytes
            if name in self._offloading:
                held += self._offloaded(name, 0)
            if held and held > self._high():
                self._wait_for_room(peer)
                peer = peers.get(name)
        if peer is not None and peer.conn is not None and peer.conn.tcp is None:
            try:  # a proc of this process (inproc): the frame is handed over, not encoded
                peer.conn.send_message(wire(header), body, buffers)
                return
            except Exception:  # closed: the slow path below reports it
                log.debug("handing a frame to %s failed", proc.name, exc_info=True)
        if pickled is not None and not buffers:
            parts = encode_pickled(pickled, body)
        elif not buffers:
            parts = encode_frame(wire(header), body)
        else:
            self.send_buffers(proc, header, body, buffers, on_fail, pickled)
            return
        if peer is not None and peer.conn is not None and not peer.conn.closed:
            try:
                peer.conn.send(parts)
                return
            except Exception:  # lost: fall through to the slow path, which reports it
                log.debug("sending a frame to %s failed", proc.name, exc_info=True)
        self.send_slow(proc, parts, on_fail, None)

    def send_buffers(
        self,
        proc: ProcId,
        header: tuple[Any, ...],
        body: bytes | memoryview,
        buffers: Sequence[ReadableBuffer],
        on_fail: Callable[[str], None] | None,
        pickled: bytes | None = None,
    ) -> None:
        """``send`` of a frame with out-of-band buffers: those of a large message are
        lent (no copy; this thread waits until they have left) or copied within the
        ``staging_max`` budget (see ``send_snapshot_max``). ``pickled``: the header's
        pickle, when the caller has it (used unless the frame is offloaded)."""
        large = _large(buffers)
        on_left: Callable[[], None] | None = None
        sent: threading.Event | None = None
        if large:
            if not self._on_io_thread() and (
                large > config.get("send_snapshot_max") or not memory.staging.try_take(large)
            ):
                sent = threading.Event()
                on_left = sent.set
            else:
                if self._on_io_thread():  # never waits: copies, within the budget or not
                    memory.staging.take(large)
                on_left = _Give(large)
        offloaded = False
        if self._offloading and not _fits(self._peers.get(proc.name), body, buffers):
            raw, buffers, offloaded = self._wrap(
                proc.name, wire(header), buffers, on_left, lend=sent is not None
            )
            parts = encode_frame(raw, body, buffers)
        elif pickled is not None:
            parts = encode_pickled(pickled, body, buffers)
        else:
            parts = encode_frame(wire(header), body, buffers)
        conn_left = None if offloaded else on_left
        try:
            peer = self._peers.get(proc.name)
            if peer is not None and peer.conn is not None and not peer.conn.closed:
                try:
                    # Lent: the caller waits; else what is not written at once is a
                    # snapshot, its budget given back once it is written.
                    peer.conn.send(parts, conn_left, copy=sent is None)
                    return
                except Exception:  # lost: fall through to the slow path, which reports it
                    log.debug("sending a frame to %s failed", proc.name, exc_info=True)
            self.send_slow(proc, parts, on_fail, conn_left, lend=sent is not None)
        finally:
            if sent is not None:
                self._wait_sent(proc.name, sent)

    def send_slow(
        self,
        proc: ProcId,
        parts: list[Any],
        on_fail: Callable[[str], None] | None,
        on_left: Callable[[], None] | None,
        *,
        lend: bool = False,
    ) -> None:
        """``send`` to a peer not connected yet (queued), lost, or whose connection
        broke. ``on_left`` as for ``Connection.send``; with ``lend`` the parts are
        queued as they are (the caller waits for ``on_left``), else copied."""
        # Sent later, if the peer is not connected yet: keep a snapshot (the caller may
        # change its arrays now). A large one is made outside the lock, which the I/O
        # thread takes, and the peer looked at again after.
        owned: list[Any] | None = parts if lend else None
        while True:
            with self._lock:
                peer = self._peers.get(proc.name)
                if peer is None:
                    peer = self._peers[proc.name] = _Peer(proc, pending=False)
                later = peer.lost is None and (peer.pending or peer.conn is None)
                if later and (owned is not None or not _has_large(parts)):
                    if owned is None:
                        owned = [p if isinstance(p, bytes) else own(p) for p in parts]
                    # A snapshot keeps its budget until it is written (on_left, which
                    # the connection calls, as it does for a lent frame).
                    peer.queue.append((owned, on_fail, on_left))
                    peer.queued_bytes += sum(len(p) for p in owned)
                    if not peer.pending and len(peer.queue) == 1:
                        self._call_soon(self._connect, peer)
                    return
                lost = peer.lost
            if not later:
                break
            owned = [p if isinstance(p, bytes) else own(p) for p in parts]
        if lost is None:
            assert peer.conn is not None
            try:
                peer.conn.send(parts, on_left, copy=not lend)
                return
            except Exception as e:
                lost = f"sending to proc {proc.name} failed: {e}"
        if on_left is not None:
            on_left()
        if on_fail is not None:
            on_fail(lost)
        else:
            raise SupervisionError(f"proc {proc.name} is unreachable: {lost}", reason=lost)
