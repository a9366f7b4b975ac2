"""Ports and channels: the one-way mailboxes every adverb is built from.

``Channel.open()`` gives a ``(Port, PortReceiver)`` pair. The receiver stays
where it was opened; the port is picklable and can be passed to any actor,
which sends back through it. Messages from one sender arrive in order.
A send to a port whose receiver is gone comes back to the sender as an
undeliverable message (see ``_handle_undeliverable_message``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import weakref
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ..._errors import SupervisionError
from ..._runtime.messaging.flow import Gate, frame_bytes
from ..._runtime.messaging.runtime import STATUS_EXC, STATUS_OK
from ..._runtime.node import this_node
from ..._wire import codec
from ..._wire.frame import flat
from ..._wire.ids import ActorId, PortId, ProcId
from ..._wire.protocol import Message, Reply
from .collect import Undecoded, set_future
from .context import context
from .failing import exception_payload
from .future import Deferred, Future, resolve

if TYPE_CHECKING:
    from ..._runtime.messaging.runtime import Runtime

__all__ = ["Channel", "Port", "PortReceiver", "PortSink", "Undeliverable", "current_sender"]

R = TypeVar("R")


def current_sender() -> ActorId | None:
    """The actor on whose behalf this thread sends (None in the client's own threads)."""
    inst = context().actor_instance
    return inst.actor_id if inst._cell is not None else None


class Undeliverable:
    """A message that could not be delivered, returned to its sender."""

    def __init__(self, sender: ActorId | None, dest: str, error: str) -> None:
        self._sender = sender
        self._dest = dest
        self._error = error

    def sender(self) -> ActorId | None:
        return self._sender

    def dest(self) -> str:
        return self._dest

    def error_msg(self) -> str:
        return self._error

    def __repr__(self) -> str:
        return f"Undeliverable(dest={self._dest!r}, error={self._error!r})"


class Port(Generic[R]):
    """The sending end of a channel. Picklable: pass it to an actor to get answers back.

    ``send(value)`` and ``exception(exc)`` never block.
    """

    def __init__(
        self, port_id: PortId, index: int = 0, *, once: bool = False, rt: Runtime | None = None
    ) -> None:
        self._port_id = port_id
        self._index = index
        self._once = once
        self._used = False
        self.return_undeliverable = True
        # The runtime it sends with, when whoever made it had one (a channel, an actor's
        # reply port); None for a port unpickled here, which sends with this process's.
        self._rt = rt

    def send(self, value: R) -> None:
        """Send ``value`` to the receiver. ``TypeError`` if it cannot be pickled."""
        self._send(STATUS_OK, value)

    def exception(self, exc: BaseException) -> None:
        """Make the receiver's ``recv()`` (or the caller's future) raise ``exc``."""
        self._send(STATUS_EXC, exception_payload(exc))

    async def resolve_and_send(self, result: R) -> None:
        """Send ``result`` from a coroutine once every mesh it refers to can be addressed.

        Monarch's ``Port.resolve_and_send``. Pickling an actor or proc mesh waits
        until its procs are up; here that wait runs on a helper thread (with this
        context, so an undeliverable message still returns to this actor), so the
        actor's event loop keeps running meanwhile.
        """
        await asyncio.to_thread(self.send, result)

    def _send(self, status: int, value: Any, via: Runtime | None = None) -> None:
        """Send ``value`` with ``status``, with the runtime ``via`` (a route's, sending a
        failure on a user's port), the port's own, or (a port unpickled here, sent on by
        the user's ``send()``: the public face) this process's."""
        if self._once and self._used:
            raise RuntimeError("this port was opened with once=True and has already been used")
        self._used = True
        body, bufs = codec.dumps_checked(value, "the value sent on the port")
        snapshot = [bytes(flat(b)) for b in bufs]  # the sender cannot know when it is read
        rt = via if via is not None else self._rt
        if rt is None:
            rt = this_node().runtime
        sender = current_sender() if self.return_undeliverable else None
        header = Reply(self._port_id.port, self._index, status, sender)
        dest = f"port {self._port_id}"
        rt.send(
            self._port_id.proc,
            header,
            body,
            snapshot,
            on_fail=lambda reason: (
                rt.bounce(sender, dest, reason) if self.return_undeliverable else None
            ),
        )

    def __reduce__(self) -> Any:
        return (_rebuild_port, (self._port_id, self._index, self._once, self.return_undeliverable))

    def __repr__(self) -> str:
        return f"<Port {self._port_id}#{self._index}>"


def _rebuild_port(port_id: PortId, index: int, once: bool, bounce: bool = True) -> Port[Any]:
    port: Port[Any] = Port(port_id, index, once=once)
    port.return_undeliverable = bounce
    return port


class PortSink:
    """Stands in for a collector when replies go to a user's port (the ``send`` adverb's
    ``port=``): the replies go there themselves; a failure is sent on it with ``rt``,
    the runtime of the route that sends."""

    def __init__(self, port: Port[Any], rt: Runtime) -> None:
        self._port = port
        self.port = port._port_id
        self._rt = rt

    def expect(self, index: int, proc: ProcId, label: str = "") -> None:
        pass

    def expect_all(self, expected: Any) -> None:
        pass

    def fail(self, index: int, reason: str) -> None:
        why = SupervisionError(f"message undeliverable: {reason}", reason=reason)
        self._port._send(STATUS_EXC, exception_payload(why), self._rt)

    def fail_supervision(self, index: int, why: str) -> None:
        self._port._send(STATUS_EXC, exception_payload(SupervisionError(why, reason=why)), self._rt)


class _DroppingPort(Port[Any]):
    """The port an explicit-response endpoint gets when its caller wants no answer."""

    def __init__(self) -> None:
        pass

    def _send(self, status: int, value: Any, via: Runtime | None = None) -> None:
        return None

    def __repr__(self) -> str:
        return "<Port (no reply wanted)>"


class _Inbox:
    """What the runtime delivers a port's messages to (its ``PortHandler``).

    Kept apart from [`PortReceiver`][danaus.actor.PortReceiver] so that the runtime's table of open
    ports does not keep the receiver alive: when the receiver is garbage
    collected its port closes, as Monarch's does.
    """

    def __init__(self, rt: Runtime, once: bool) -> None:
        self._rt = rt
        self._lock = threading.Lock()  # guards _values and _waiters (one of them is empty)
        self._values: collections.deque[tuple[bool, Any, int, int]] = collections.deque()
        # Bytes of the messages nobody has taken yet: above inbox_high_water the
        # connections bringing more pause, unless a thread of this process is waiting
        # (it may be the reader, waiting for something behind them).
        self.gate = Gate(
            rt.backpressure, lambda: rt.waits > 0, high="inbox_high_water", low="inbox_low_water"
        )
        # (future, ranked): a ranked reader gets (the sender's rank, the value)
        self._waiters: collections.deque[tuple[concurrent.futures.Future[Any], bool]] = (
            collections.deque()
        )
        self._once = once
        # Set when a proc this port watches (PortReceiver._watch) is lost: readers then
        # fail with it once the messages already here are taken, instead of waiting.
        self._lost: SupervisionError | None = None
        self.port_id: PortId = rt.router.open_port(self)

    # PortHandler, on the I/O thread
    def deliver(self, frame: Message) -> None:
        # Unpickled by whoever reads it (recv().get() or await), not here.
        value = Undecoded(frame, f"a message on port {self.port_id}", port=True)
        ok = value.ok
        rank = frame.header.slot  # the sender's rank, for a reply; a port's index otherwise
        with self._lock:
            waiter = self._waiters.popleft() if self._waiters else None
            if waiter is None:
                n = frame_bytes(frame)
                self._values.append((ok, value, n, rank))
        if waiter is not None:
            cf, ranked = waiter
            set_future(cf, ok, _Ranked(rank, value) if ranked else value)
        else:
            self.gate.arrived(n)
        if self._once:
            self._rt.router.close_port(self.port_id.port)

    def peer_lost(self, proc: str, reason: str) -> None:
        """A proc this port watches was lost (only ``_watch`` asks for this: any proc may
        hold a port, and none is awaited unless the receiver says so)."""
        self.lose(
            SupervisionError(f"proc {proc}, which sends on {self.port_id}, is gone: {reason}")
        )

    def lose(self, err: SupervisionError) -> None:
        with self._lock:
            self._lost = err
            waiters, self._waiters = list(self._waiters), collections.deque()
        for cf, _ in waiters:
            cf.set_exception(err)

    def next(self, ranked: bool = False) -> concurrent.futures.Future[Any]:
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._values:
                ok, value, n, rank = self._values.popleft()
                self.gate.taken(n)
                set_future(cf, ok, _Ranked(rank, value) if ranked else value)
            elif self._lost is not None:
                cf.set_exception(self._lost)
            else:
                self._waiters.append((cf, ranked))
        return cf


class _Ranked(Deferred):
    """``(rank, value)``, unpickled by its reader (raising what ``value`` raises)."""

    __slots__ = ("ok",)

    def __init__(self, rank: int, value: Any) -> None:
        super().__init__(lambda: (rank, resolve(value)))
        self.ok = value.ok


class PortOwner(Protocol):
    """The actor that opened a receiver (its cell): it closes the receiver's port when
    it stops, unless told the port was closed already."""

    def own_port(self, port: int) -> None: ...

    def disown_port(self, port: int) -> None: ...


def _close_port(rt: Runtime, port: int, cell: PortOwner | None, gate: Gate | None = None) -> None:
    """Close a receiver's port (closed, collected): later sends bounce to their senders."""
    rt.router.close_port(port)
    if gate is not None:
        gate.close()  # nobody will take what it holds: read its connections again
    if cell is not None:
        cell.disown_port(port)


def _owning_cell() -> PortOwner | None:
    """The actor cell on whose thread a receiver is being opened (None in the client)."""
    cell: PortOwner | None = context().actor_instance._cell
    return cell


class PortReceiver(Generic[R]):
    """The receiving end of a channel; ``recv()`` returns a future of the next message.

    Its port closes (later sends come back to their senders as undeliverable)
    when it is closed, when it is garbage collected, and when the actor that
    opened it stops.
    """

    def __init__(self, once: bool = False, rt: Runtime | None = None) -> None:
        # The public face (``Channel.open()``, a user's call holding nothing) looks the
        # node up; ``rt``: the runtime of a caller that holds one.
        if rt is None:
            rt = this_node().runtime
        self._inbox = _Inbox(rt, once)
        self.port_id = self._inbox.port_id
        cell = _owning_cell()
        if cell is not None:
            cell.own_port(self.port_id.port)
        self._closer = weakref.finalize(
            self, _close_port, rt, self.port_id.port, cell, self._inbox.gate
        )

    def recv(self) -> Future[R]:
        """A future of the next message (or the exception sent with ``Port.exception``).

        Never blocks; ``recv().get()`` waits for the message.
        """
        return Future._create(self._inbox.next(), f"a message on port {self.port_id}")

    def close(self) -> None:
        """Stop receiving: later sends come back to their senders as undeliverable."""
        self._closer()

    def _watch(self, proc: ProcId) -> None:
        """Fail this receiver's readers with ``SupervisionError`` when ``proc`` is lost
        (after the messages already here), for a reader that waits on one sender."""
        reason = self._inbox._rt.peers.watch(proc, self.port_id.port)
        if reason is not None:
            self._inbox.peer_lost(proc.name, reason)

    def ranked(self) -> RankedPortReceiver[R]:
        """This receiver's messages as ``(rank, value)``: the rank of the actor whose
        reply it is (``send(endpoint, ..., port=port)``), as Monarch's ``ranked()``."""
        return RankedPortReceiver(self)

    def __repr__(self) -> str:
        return f"<PortReceiver {self.port_id}>"


class RankedPortReceiver(Generic[R]):
    """A [`PortReceiver`][danaus.actor.PortReceiver] whose ``recv()`` gives ``(rank, value)``; made
    by
    ``PortReceiver.ranked()`` or ``Channel.open_ranked()``. A message sent on a port
    made by ``Channel.open`` carries rank 0."""

    def __init__(self, receiver: PortReceiver[R]) -> None:
        self._receiver = receiver  # keeps the port open
        self.port_id = receiver.port_id

    def recv(self) -> Future[tuple[int, R]]:
        """A future of ``(rank, the next message)``. Never blocks."""
        return Future._create(
            self._receiver._inbox.next(ranked=True), f"a message on port {self.port_id}"
        )

    def close(self) -> None:
        self._receiver.close()

    def __repr__(self) -> str:
        return f"<RankedPortReceiver {self.port_id}>"


class Channel(Generic[R]):
    """Factory of ``(Port, PortReceiver)`` pairs."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[R], PortReceiver[R]]:
        """Open a channel; ``once=True`` for a single message."""
        receiver: PortReceiver[R] = PortReceiver(once)
        return Port(receiver.port_id, 0, once=once, rt=receiver._inbox._rt), receiver

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[R], RankedPortReceiver[R]]:
        """``open()``, with a receiver that gives ``(rank, value)`` (see ``ranked()``)."""
        port, receiver = Channel[R].open(once)
        return port, receiver.ranked()
