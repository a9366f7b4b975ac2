"""``ActorCell``: hosts one actor in a proc — its thread, its inbox, its message loop.

Each actor runs on a thread of its own and handles one message at a time.
Sync actors block their thread in each endpoint (so ``Future.get()`` inside
an endpoint is fine); async actors (``async_cell.AsyncActorCell``) run an
event loop on that thread and await each endpoint to completion before taking
the next message.

Messages arrive from the I/O thread through ``deliver`` in the order of the
connection they came on, so each sender→actor pair is FIFO. The first item of
every inbox is the actor's construction, so ``__init__`` runs before any
message from the spawner.

The cell is made of parts, each with one concern, that share no fields:

- its `Inbox`: the order items run in,
  backpressure on what brings them, deadlock refusals while the actor waits,
  and draining at the stop;
- the invoke step (``invoke.py``): a call decoded into an ``Invocation`` runs
  the endpoint's body and yields an ``Outcome`` (value, or exception), which
  the cell settles: it replies, or answers or fails on the exception;
- its `Fate`: whether and why it failed,
  and telling its callers and its owner;
- its `Hooks`: the actor's
  ``__supervise__``, ``_handle_undeliverable_message`` and ``__cleanup__``;
- its `Meter`: endpoint metrics, the
  messages table's rows and spans.

The cell itself holds the actor's identity and instance, runs the loop, and
stops it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ... import _config as config
from ..._mesh import Extent, Point
from ..._runtime.messaging.flow import frame_bytes
from ..._runtime.messaging.metrics import EndpointStats
from ..._runtime.messaging.runtime import STATUS_OK
from ..._runtime.node import Node
from ..._wire.ids import ActorId, PortId, ProcId
from ..._wire.protocol import Message
from . import logprefix as _logprefix  # noqa: F401  (installs the actor log prefix)
from . import owned, telemetry
from .context import Context, Instance, _current, _thread_ctx
from .deadlock import closes_cycle, refuse_deadlock
from .endpoints import EndpointTable
from .failing import Fate, exception_payload
from .handoff import Wrapped
from .hooks import Hooks
from .inbox import ANSWERED, Bounced, HookItem, Inbox, Item, Stop, Supervise
from .invoke import (
    Contexts,
    Invocation,
    Outcome,
    decode,
    decode_body,
    invoke,
    record,
)
from .measure import Meter
from .ports import Port, Undeliverable, _DroppingPort
from .waiting import Waits

__all__ = ["ActorCell", "exception_payload"]

log = logging.getLogger("danaus.actor")

FLAG_EXPLICIT, FLAG_AS_ENDPOINT = 1, 2  # CALL header flags


def cell_of_this_thread() -> ActorCell | None:
    """The cell whose thread this is (any of its tasks), if any."""
    ctx = _current.get()
    cell = ctx.actor_instance._cell if ctx is not None else None
    if cell is None or cell.thread is not threading.current_thread():
        return None
    return cell  # type: ignore[no-any-return]


def on_held_back(blocked: bool) -> None:
    """``Runtime.block_hook``: an actor's send is held back by backpressure (or no more).

    While it is, its own inbox pauses no connection (``Inbox.held_back``).
    """
    cell = cell_of_this_thread()
    if cell is not None:
        cell.inbox.held_back(blocked)


class ActorCell:
    """One actor living in this proc (the module doc lists its parts): a sync actor's,
    and the base of an async one's (``async_cell.AsyncActorCell``)."""

    serial_task: Any = None  # an async actor's serial worker (only its waits block it)
    stopping = False  # its stop has begun: cancelled bodies are not failures

    def __init__(
        self,
        node: Node,
        mesh_id: str,
        rank: int,
        spawn: Message,
        on_exit: Callable[[ActorCell], None],
    ) -> None:
        _, _, init_port, _, labels, sizes, owner, mode = spawn.header
        self.node = node  # the node of its proc: what the actor reaches, it reaches through this
        self.rt = rt = node.runtime
        self.mesh_id = mesh_id
        self.rank = rank
        self.init_port: PortId = init_port
        self.extent = Extent(list(labels), list(sizes))
        self.display_name = mesh_id.rsplit(".", 1)[0]
        self.on_exit = on_exit
        self.mode: str = mode
        self.started = time.time()  # wall clock, for the actors table
        self.instance: Any = None
        self.ctx_instance: Instance | None = None
        self.endpoints = EndpointTable()
        # The pdb session breakpoint() opened, while one is open (the debugger's RemotePdb,
        # whose endpoint_done(cell, exc) ends it).
        self.debugging: Any = None
        # Ports its open receivers hold: closed when it stops. No lock: disown_port runs
        # from garbage collection, on any thread; set.add/discard are atomic.
        self._ports: set[int] = set()
        self.fate = Fate(rt, mesh_id, rank, owner)
        self.meter = Meter(rt, mesh_id, rank, self)
        self.hooks = Hooks(self.fate)
        self.contexts = Contexts()  # its calls' contexts, once it is constructed
        self.inbox = Inbox(
            rt.backpressure,
            recent=rt.observing.recent,
            reader_for=rt.reader_for,
            flush_held=rt.transport.batching.flush_held,
            loop=self._new_loop(),
            closes_cycle=self._closes_cycle,
            refuse_deadlock=self._refuse_deadlock,
            refuse=self.fate.refuse,
        )
        self.deliver: Callable[[Message, ProcId | None], None] = self.inbox.deliver
        self.direct_call: Callable[[Message, ProcId | None], bool] = self.inbox.direct_call
        self.thread = threading.Thread(
            target=self._main, args=(spawn,), name=f"actor-{mesh_id}[{rank}]", daemon=True
        )
        self.thread.start()

    # -- the mailbox (I/O thread) and what others ask of the actor -----------------------
    #
    # ``deliver`` (the runtime's ``Mailbox``) and ``direct_call`` are the inbox's own
    # methods, set in __init__: no call of the cell's in between, per message.

    def undeliverable(self, envelope: Undeliverable) -> None:
        """Queue ``_handle_undeliverable_message(envelope)`` on the actor's thread."""
        self.inbox.put(Bounced(envelope))

    def supervise(self, failure: object) -> None:
        """Queue ``__supervise__(failure)`` to run on the actor's thread, between messages."""
        self.inbox.put(Supervise(failure))

    def stop(self, port: PortId | None, index: int, reason: str) -> None:
        """Stop the actor behind the items already queued; then reply to ``port``."""
        self.inbox.put(Stop(port, index, reason))

    def fail(
        self, reason: str, tb: str, exc: BaseException | None = None, origin: str = ""
    ) -> None:
        """Fail the actor (any thread): `Fate.fail <failing.Fate.fail>()`."""
        self.fate.fail(reason, tb, exc, origin)

    def own_port(self, port: int) -> None:
        """Close port ``port`` when this actor stops (a receiver it opened)."""
        self._ports.add(port)

    def disown_port(self, port: int) -> None:
        """Port ``port`` was closed already (its receiver was closed or collected)."""
        self._ports.discard(port)

    def waits(self) -> Waits | None:
        """What the calling thread tells when it blocks on a result, if it is this actor's
        serial path: its inbox (which tells the runtime too). An async actor's concurrent
        tasks do not block it."""
        if self.thread is not threading.current_thread():
            return None
        if self.serial_task is not None:
            try:
                if asyncio.current_task() is not self.serial_task:
                    return None
            except RuntimeError:
                pass
        return self.inbox

    # What the dashboard, introspection and telemetry read.

    @property
    def failed(self) -> str | None:
        """Why the actor failed, if it did."""
        return self.fate.failed

    @property
    def stopped(self) -> bool:
        return self.inbox.stopped

    @property
    def running(self) -> str | None:
        """The endpoint running now, if any."""
        return self.meter.running

    @property
    def stats(self) -> dict[str, EndpointStats]:
        """Endpoint name -> its metrics."""
        return self.meter.stats

    def _label(self) -> str:
        return self.fate.label

    # -- the inbox's callbacks --------------------------------------------------------------

    def _closes_cycle(self, frame: Message) -> bool:
        inst = self.ctx_instance
        return closes_cycle(inst.actor_id if inst is not None else None, self.endpoints, frame)

    def _refuse_deadlock(self, frame: Message) -> None:
        refuse_deadlock(self.rt, self._label(), frame)

    # -- the actor's thread -------------------------------------------------------------

    def _main(self, spawn: Message) -> None:
        try:
            self._run(spawn)
        except BaseException as e:  # a bug of ours: the actor fails, its callers hear
            _, tb = exception_payload(e)
            self.fate.fail(f"actor {self._label()} died of an internal error in danaus: {e!r}", tb)
            self.inbox.close()

    def _run(self, spawn: Message) -> None:
        try:
            cls, args, kwargs, name, creator = decode(spawn)
        except BaseException as e:
            what = "its class or arguments could not be unpickled"
            self.fate.init_failed(e, what, self.init_port)
            self._serve(None, (), {})  # to answer what comes, and the stop
            self.on_exit(self)
            return
        self.display_name = name
        inst = Instance(
            ActorId(self.rt.proc_id, self.mesh_id, self.rank),
            name,
            Point(self.rank, self.extent),
            cls.__qualname__,
            creator,
            class_module=cls.__module__,
            node=self.node,
        )
        inst._cell = self
        self.ctx_instance = self.fate.instance = self.contexts.instance = inst
        self.meter.named(name, cls.__name__)
        _thread_ctx.ctx = Context(inst, Point(self.rank, self.extent))
        self.endpoints = EndpointTable(cls)
        self._serve(cls, args, kwargs)
        self.on_exit(self)

    def _new_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the inbox hands items to (a sync actor has none)."""
        return None

    def _serve(self, cls: type | None, args: Any, kwargs: Any) -> None:
        """Construct the actor (unless ``cls`` is None: it failed to decode) and run its
        items until it stops."""
        if cls is not None:
            self._construct(cls, args, kwargs)
        self._sync_loop()

    def _construct(self, cls: Any, args: Any, kwargs: Any) -> None:
        try:
            inst = cls.__new__(cls)
            self.instance = inst
            inst.__init__(*args, **kwargs)
        except BaseException as e:
            self._debug_finish(e)
            self.fate.init_failed(e, f"{cls.__qualname__}.__init__ raised", self.init_port)
            return
        self._debug_finish(None)
        self.rt.reply(self.init_port, self.rank, STATUS_OK, None)

    def _sync_loop(self) -> None:
        inbox = self.inbox
        inbox.open_bell(bool(config.get("direct_read")))
        try:
            self._sync_items()
        finally:
            inbox.close_bell()

    def _sync_items(self) -> None:
        poll, wait_next = self.inbox.poll, self.inbox.wait_next
        fate = self.fate
        item: Item | None
        while True:
            try:
                item = poll()
            except queue.Empty:
                item = wait_next()
            if type(item) is Message:
                try:
                    self._handle_sync(item)
                except BaseException as e:  # a bug of ours: fail loudly, never die silently
                    fate.internal_error(item, e)
            elif type(item) is Stop:
                self._stop_children(item.reason)
                self._finish(item, cleanup=True)
                return
            else:
                assert isinstance(item, HookItem)
                self.hooks.run_sync(self.instance, item)
            item = None  # drop the last message now: its buffers may be shared memory
            if fate.failed is not None and not self.hooks.cleaned:
                fate.owned_stopped(config.get("stop_proc_timeout"))
                self.hooks.cleanup_sync(self.instance, fate.fail_exc)

    # -- handling one call ----------------------------------------------------------------

    def _prepare(self, frame: Message) -> Invocation | None:
        """Take call ``frame`` and decode it; reply and return None if it cannot run."""
        # Its fields by name (protocol.Call), unpacked at once: one step, not eleven.
        _, _, method, port, index, labels, sizes, sender, chain, flags, trace = frame.header
        row = self.inbox.take(frame)
        if row is ANSWERED:
            return None
        fate = self.fate
        if fate.failed is not None:
            fate.reply_error(port, index, fate.failed)
            return None
        prop = self.endpoints.get(method)
        if prop is None and flags & FLAG_AS_ENDPOINT:
            prop = self.endpoints.adhoc(method, bool(flags & FLAG_EXPLICIT))
        if prop is None:
            what = f"{type(self.instance).__qualname__} has no endpoint {method!r}"
            fate.reply_exc(port, index, AttributeError(what))
            return None
        wrapped = None
        try:
            decoded = decode(frame)
            if type(decoded) is Wrapped:  # arguments handed off on this proc (handoff.py)
                wrapped = decoded
                args, kwargs = wrapped.open(self.node, frame.buffers, decode_body)
            else:
                args, kwargs = decoded
        except BaseException as e:
            if wrapped is not None:
                wrapped.finish(self.node, error=e)
            fate.reply_exc(port, index, e)
            return None
        assert self.ctx_instance is not None
        # context.set_context, without the call in between (one a message)
        _current.set(self.contexts[index, labels, sizes, chain])
        if prop.explicit_response_port:  # the endpoint answers through the port itself
            reply_to: Port[Any] = (
                Port(port, index, rt=self.rt) if port is not None else _DroppingPort()
            )
            args = (reply_to, *args)
        if row is not None:  # sampled for the messages table (on delivery)
            who = str(sender) if sender is not None else (port.proc.name if port else None)
            row.mesh_id, row.rank, row.endpoint = self.mesh_id, self.rank, method
            row.sender, row.request_bytes = who, frame_bytes(frame)
        return record(Invocation, (prop, port, index, args, kwargs, wrapped, row, trace))

    def _handle_sync(self, frame: Message) -> None:
        call = self._prepare(frame)
        if call is None:
            return
        prop, _, _, _, _, _, _, carried = call
        # A call made inside a span (telemetry on): the endpoint runs in a child span.
        active = telemetry.endpoint_span(self, prop, carried) if carried is not None else None
        self.meter.running = prop.name
        self._settle(call, invoke(self.instance, call), active)

    def _settle(self, call: Invocation, outcome: Outcome, active: Any) -> None:
        """A call's body ended (sync and async actors alike): end its span (``active``, the
        one telemetry started, if any), its handoff and its debug session, measure it,
        and reply with its value or answer (or fail on) its exception."""
        value, e, t0 = outcome  # its fields, unpacked at once
        prop, port, index, _, _, wrapped, row, _ = call
        if active is not None:
            telemetry.end_endpoint_span(active, e)
        if wrapped is not None:
            if e is None:
                wrapped.finish(self.node, value if wrapped.returns else None)
            else:
                wrapped.finish(self.node, error=e)
        if self.debugging is not None:  # the common case costs one attribute read
            self.debugging.endpoint_done(self, e)
        self.meter.measured(prop.name, t0, e is None, port, index, row, active)
        if e is None:
            if port is not None and not prop.explicit_response_port:
                n = self.rt.reply(port, index, STATUS_OK, value)
                if row is not None:
                    row.reply_bytes = n
            return
        if wrapped is not None and wrapped.returns and isinstance(e, Exception):
            return  # the producers record it (rref): the actor does not fail
        self.fate.raised(e, prop, port, index, self.stopping or self.inbox.stopped)

    def _debug_finish(self, exc: BaseException | None) -> None:
        """End the pdb session breakpoint() opened in this endpoint (post-mortem on ``exc``)."""
        if self.debugging is not None:  # the common case costs one attribute read
            self.debugging.endpoint_done(self, exc)

    # -- stopping -------------------------------------------------------------------------

    def _stop_children(self, reason: str) -> None:
        if self.ctx_instance is not None:
            owned.stop_owned(self.node, self.ctx_instance.actor_id, f"its owner stopped: {reason}")

    def _finish(self, item: Stop, cleanup: bool) -> None:
        """The stop: ``__cleanup__`` (``cleanup``: here), answer what is left, close the
        actor's ports, let go of what it holds and reply to the stop."""
        fate = self.fate
        if cleanup and self.instance is not None:
            self.hooks.cleanup_sync(self.instance, None if fate.failed is None else fate.fail_exc)
        self.inbox.close()  # whatever arrived behind the stop is answered, never dropped
        ports, self._ports = self._ports, set()
        for no in ports:  # later sends to them come back to their senders
            self.rt.router.close_port(no)
        self._release()
        if item.port is not None:
            self.rt.reply(item.port, item.slot, STATUS_OK, None)

    def _release(self) -> None:
        """Drop what a stopped actor holds; the cell stays only to answer "was stopped"."""
        self.inbox.release()
        self.instance = None
        self.endpoints = EndpointTable()
