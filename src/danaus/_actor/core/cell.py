"""``ActorCell``: hosts one actor in a proc — its thread, its inbox, its message loop.

Each actor runs on a thread of its own and handles one message at a time.
Sync actors block their thread in each endpoint (so ``Future.get()`` inside
an endpoint is fine); async actors run an event loop on that thread and
await each endpoint to completion before taking the next message.

Messages arrive from the I/O thread through ``deliver`` in the order of the
connection they came on, so each sender→actor pair is FIFO. The first item of
every inbox is the actor's construction, so ``__init__`` runs before any
message from the spawner.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from ... import _config as config
from ..._mesh import Extent, Point
from ..._runtime.messaging.flow import Gate, frame_bytes
from ..._runtime.messaging.metrics import EndpointStats
from ..._runtime.messaging.runtime import STATUS_OK, Runtime
from ..._wire import codec
from ..._wire.ids import ActorId, PortId, ProcId
from ..._wire.protocol import Message
from . import logprefix as _logprefix  # noqa: F401  (installs the actor log prefix)
from . import owned, telemetry
from .context import Context, Instance, _current, _thread_ctx, set_context
from .deadlock import DeadlockCheck
from .endpoints import EndpointProperty, endpoints_of
from .failing import Failing, exception_payload, refuse_stopped
from .handoff import Wrapped
from .ports import Port, _DroppingPort

if TYPE_CHECKING:
    from .ports import Undeliverable

__all__ = ["ActorCell", "exception_payload"]

log = logging.getLogger("danaus.actor")

FLAG_EXPLICIT, FLAG_AS_ENDPOINT = 1, 2  # CALL header flags


# -- the inbox's items: one record per kind, told apart by type ----------------------
#
# A call (the per-message kind) is queued as its ``Message`` itself: nothing to build.


class _Stop(NamedTuple):
    """Stop the actor; then reply ``None`` to ``port`` at ``slot`` (if any)."""

    port: PortId | None
    slot: int
    reason: str


class _Supervise(NamedTuple):
    """Run ``__supervise__(failure)`` between messages."""

    failure: Any


class _Bounced(NamedTuple):
    """Run ``_handle_undeliverable_message(envelope)`` between messages."""

    envelope: Any


_Item = Message | _Stop | _Supervise | _Bounced


# Unpickling a spawn or a call may import a module for the first time. Python's
# per-module import locks do not make that safe when several actor threads do
# it at once: a thread importing ``pkg.sub`` while another is still running
# ``pkg/__init__`` sees ``pkg`` half initialised ("partially initialized
# module", as torch fails). The import system is process-wide state, so one
# process-wide lock serialises decoding; an uncontended acquire costs ~0.1 us.
_DECODE_LOCK = threading.RLock()


_POINTS_KEPT = 256
# Results that are certainly not awaitable (skips inspect's ABC check per call).
_PLAIN_RESULTS = frozenset({type(None), bool, int, float, str, bytes, tuple, list, dict})


def cell_of_this_thread() -> ActorCell | None:
    """The cell whose thread this is (any of its tasks), if any."""
    ctx = _current.get()
    cell = ctx.actor_instance._cell if ctx is not None else None
    if cell is None or cell.thread is not threading.current_thread():
        return None
    return cell  # type: ignore[no-any-return]


def on_held_back(blocked: bool) -> None:
    """``Runtime.block_hook``: an actor's send is held back by backpressure (or no more).

    While it is, its own inbox pauses no connection: the bytes that would
    unblock it may be behind them (two actors sending to each other).
    """
    cell = cell_of_this_thread()
    if cell is not None:
        with cell._lock:
            cell.blocked += 1 if blocked else -1


def _decode(frame: Message) -> Any:
    """Unpickle a frame's body, one actor thread of this proc at a time."""
    with _DECODE_LOCK:
        return codec.loads(frame.body, frame.buffers)


def _decode_body(body: bytes, buffers: Any) -> Any:
    """Unpickle a wrapped call's arguments (``handoff.Wrapped``) under the same lock."""
    with _DECODE_LOCK:
        return codec.loads(body, buffers)


class ActorCell(Failing, DeadlockCheck):
    """One actor living in this proc."""

    def __init__(
        self,
        rt: Runtime,
        mesh_id: str,
        rank: int,
        spawn: Message,
        on_exit: Callable[[ActorCell], None],
    ) -> None:
        _, _, init_port, _, labels, sizes, owner, mode = spawn.header
        self.rt = rt
        self.mesh_id = mesh_id
        self.rank = rank
        self.init_port: PortId = init_port
        self.owner: ActorId | None = owner
        self.extent = Extent(list(labels), list(sizes))
        self.spawn_frame = spawn
        self.creator: Instance | None = None
        self.display_name = mesh_id.rsplit(".", 1)[0]
        self.on_exit = on_exit
        self.instance: Any = None
        self.ctx_instance: Instance | None = None
        self.endpoints: dict[str, EndpointProperty] = {}
        self.failed: str | None = None
        self.fail_exc: BaseException | None = None
        self.owned_stopping: threading.Thread | None = None
        self._cleaned = False  # __cleanup__ ran (at a stop, or after a failure)
        self.stopped = False
        self.stopping = False  # its stop has begun: cancelled bodies are not failures
        self.mode: str = mode
        # The pdb session breakpoint() opened, while one is open (the debugger's RemotePdb,
        # whose endpoint_done(cell, exc) ends it).
        self.debugging: Any = None
        # The lock guards stopped, the wait and receive counts, the queued and answered calls, and
        # the inbox's bell.
        self._lock = threading.Lock()
        self.serial_task: Any = None
        self.waiting = 0  # how many waits (Future.get / await) are in progress on this actor
        self.blocked = 0  # sends of this actor held back by backpressure, in progress
        # Bytes in the inbox: above inbox_high_water the connections bringing more pause,
        # unless the actor cannot consume now (waiting, or itself held back).
        self._gate = Gate(rt, self._cannot_consume, high="inbox_high_water", low="inbox_low_water")
        self._queued: dict[int, Message] = {}  # calls in the inbox, for deadlock checks
        self._answered: set[int] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._adhoc: dict[tuple[str, int], EndpointProperty] = {}
        self._ports: set[int] = set()  # ports its open receivers hold: closed when it stops
        # Metrics (danaus._runtime.messaging.metrics): written on the actor's thread (received:
        # on the I/O thread, under _lock), read by STATS snapshots on the I/O thread.
        self.received = 0
        self.running: str | None = None  # the endpoint running now
        self.stats: dict[str, EndpointStats] = {}
        # Calls sampled for the telemetry query's messages table (rt.recent): id(frame) ->
        # (perf_counter_ns at arrival, sampling stride), set on delivery, taken by _prepare.
        self._arrived: dict[int, tuple[int, int]] = {}
        self.started = time.time()  # wall clock, for the actors table
        self._q: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        # An idle sync actor reads the connection its last call came on itself
        # (Connection.read_directly); _put rings the bell to end that wait.
        self._home: ProcId | None = None
        self._bell = -1  # an eventfd, made when its thread starts (direct_read on)
        self._bell_on = False
        self._rung = False  # the bell was rung and not read yet
        self._tid = 0  # its thread's ident (sync actors)
        self._points: dict[tuple[Any, ...], Point] = {}  # message ranks already built
        self._aq: asyncio.Queue[_Item] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if mode == "async":
            self._loop = asyncio.new_event_loop()
            self._aq = asyncio.Queue()
        self.thread = threading.Thread(
            target=self._main, name=f"actor-{mesh_id}[{rank}]", daemon=True
        )
        self.thread.start()

    # -- inbox (I/O thread) ---------------------------------------------

    def deliver(self, frame: Message, sender: ProcId | None) -> None:
        # Sampled for the telemetry query's messages table before the lock, to keep the
        # lock's hold short (take() tolerates races: they only blur its rate estimate).
        recent = self.rt.recent
        stride = recent.take() if recent is not None else 0
        arrived = (time.perf_counter_ns(), stride) if stride else None
        with self._lock:  # atomic with begin_wait: a cycling call is never missed
            cycles = bool(self.waiting) and self._closes_cycle(frame)
            self.received += 1
            if not cycles:
                self._queued[id(frame)] = frame
                if arrived is not None:
                    self._arrived[id(frame)] = arrived
        if cycles:
            self._refuse_deadlock(frame)
            return
        if sender is not None:  # a CALL frame on the connection from it (not a cast)
            self._home = sender if _single(frame.header.sizes) else None
        self._gate.arrived(frame_bytes(frame))
        self._put(frame)

    def direct_call(self, frame: Message, sender: ProcId | None) -> bool:
        """Take a call read directly by a thread other than the I/O thread (the
        runtime's ``_direct_frame``); False to leave it to the I/O thread, which
        alone may pause a connection (when it would push the inbox over its mark)."""
        gate = self._gate
        if gate.high > 0 and gate.bytes + frame_bytes(frame) > gate.high:
            return False
        self.deliver(frame, sender)
        return True

    def _cannot_consume(self) -> bool:
        return bool(self.waiting or self.blocked or self.stopped)

    def undeliverable(self, envelope: Undeliverable) -> None:
        """Queue ``_handle_undeliverable_message(envelope)`` on the actor's thread."""
        self._put(_Bounced(envelope))

    def stop(self, port: PortId | None, index: int, reason: str) -> None:
        self._put(_Stop(port, index, reason))

    # No lock for _ports: disown_port runs from garbage collection, on any thread
    # and possibly inside a ``with self._lock``; set.add/discard are atomic.
    def own_port(self, port: int) -> None:
        """Close port ``port`` when this actor stops (a receiver it opened)."""
        self._ports.add(port)

    def disown_port(self, port: int) -> None:
        """Port ``port`` was closed already (its receiver was closed or collected)."""
        self._ports.discard(port)

    def supervise(self, failure: object) -> None:
        """Queue ``__supervise__(failure)`` to run on the actor's thread, between messages."""
        self._put(_Supervise(failure))

    def _put(self, item: _Item) -> None:
        with self._lock:
            if not self.stopped:
                if self._loop is not None:
                    assert self._aq is not None
                    self._loop.call_soon_threadsafe(self._aq.put_nowait, item)
                else:
                    self._q.put(item)
                    if self._bell_on and threading.get_ident() != self._tid:
                        # Its thread reads a connection (not this one, which is it):
                        # end that read. Under _lock, so the bell is still open.
                        try:
                            os.eventfd_write(self._bell, 1)
                        except OSError:  # full: it only needs to be readable
                            pass
                        self._rung = True
                return
        self._refuse(item)

    def _refuse(self, item: _Item) -> None:
        """Answer an item that arrived after the actor stopped."""
        if type(item) is Message:
            self._gate.taken(frame_bytes(item))
            refuse_stopped(self.rt, self._label(), item.header)
        elif type(item) is _Supervise:
            log.error("actor %s stopped before it could supervise: %s", self._label(), item.failure)
        elif type(item) is _Bounced:
            log.warning(
                "actor %s had stopped when a message it sent came back: %s",
                self._label(),
                item.envelope,
            )
        elif type(item) is _Stop and item.port is not None:
            self.rt.reply(item.port, item.slot, STATUS_OK, None)

    # -- the actor's thread -----------------------------------------------

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as e:  # a bug of ours: the actor fails, its callers hear
            _, tb = exception_payload(e)
            self.fail(f"actor {self._label()} died of an internal error in danaus: {e!r}", tb)
            with self._lock:
                self.stopped = True
            while True:
                try:
                    self._refuse(self._q.get_nowait())
                except queue.Empty:
                    break

    def _run(self) -> None:
        frame = self.spawn_frame
        try:
            cls, args, kwargs, name, self.creator = _decode(frame)
        except BaseException as e:
            self._init_failed(e, "its class or arguments could not be unpickled")
            if self._loop is not None:
                self._loop.run_until_complete(self._amain(None, (), {}))
                self._close_loop()
            else:
                self._sync_loop()
            self.on_exit(self)
            return
        self.display_name = name
        self.ctx_instance = Instance(
            ActorId(self.rt.proc_id, self.mesh_id, self.rank),
            name,
            Point(self.rank, self.extent),
            cls.__qualname__,
            self.creator,
            class_module=cls.__module__,
        )
        self.ctx_instance._cell = self
        _thread_ctx.ctx = Context(self.ctx_instance, Point(self.rank, self.extent))
        self.endpoints = endpoints_of(cls)
        if self._loop is not None:
            loop = self._loop
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._amain(cls, args, kwargs))
            self._close_loop()
        else:
            self._construct(cls, args, kwargs)
            self._sync_loop()
        self.on_exit(self)

    def _construct(self, cls: Any, args: Any, kwargs: Any) -> None:
        try:
            inst = cls.__new__(cls)
            self.instance = inst
            inst.__init__(*args, **kwargs)
        except BaseException as e:
            self._debug_finish(e)
            self._init_failed(e, f"{cls.__qualname__}.__init__ raised")
            return
        self._debug_finish(None)
        self.rt.reply(self.init_port, self.rank, STATUS_OK, None)

    def _label(self) -> str:
        return f"{self.mesh_id}[{self.rank}]"

    def _close_loop(self) -> None:
        assert self._loop is not None and self._aq is not None
        self._loop.run_until_complete(asyncio.sleep(0))  # run inbox puts already scheduled
        while not self._aq.empty():
            self._refuse(self._aq.get_nowait())
        self._loop.close()

    def _sync_loop(self) -> None:
        self._tid = threading.get_ident()
        if config.get("direct_read"):
            # Made now, not at the first idle wait: an actor costs the same descriptors
            # for its whole life (so leaks show as growth).
            self._bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            self._sync_items()
        finally:
            with self._lock:  # no _put is ringing it
                self._bell_on = False
                bell, self._bell = self._bell, -1
            if bell >= 0:
                os.close(bell)

    def _idle_get(self) -> _Item:
        """The next item of a sync actor with nothing to do (its thread).

        While no call is queued it reads the connection its last call came on
        (when no other thread is reading it): a call then reaches it without
        waking the I/O thread and then this one. Anything else queued for it
        rings the bell, which ends the read.
        """
        q = self._q
        home = self._home
        conn = self.rt.reader_for(home) if home is not None and self._bell >= 0 else None
        if conn is None:
            return q.get()
        self._bell_on = True
        try:
            while q.empty():
                if not conn.read_directly(_queued(q), _IDLE_READ, self._bell):
                    break
                if self._rung:  # set after the write: reading now finds it
                    self._rung = False
                    try:
                        os.eventfd_read(self._bell)
                    except BlockingIOError:
                        pass
        finally:
            self._bell_on = False
        return q.get()

    def _sync_items(self) -> None:
        q = self._q
        while True:
            try:
                item = q.get_nowait()
            except queue.Empty:
                item = None  # drop the last message now: its buffers may be shared memory
                self.rt.flush_held()  # idle now: replies held for a batched write go out
                item = self._idle_get()
            if type(item) is Message:
                try:
                    self._handle_sync(item)
                except BaseException as e:  # a bug of ours: fail loudly, never die silently
                    self._internal_error(item, e)
            elif type(item) is _Stop:
                self._stop_children(item.reason)
                self._finish(item, self._cleanup_sync)
                return
            else:
                arg, fn, done = self._hook_for(item)
                done(arg, *_call_hook(fn, arg))
            if self.failed is not None and not self._cleaned:
                self._owned_stopped()
                self._cleanup_sync(self.fail_exc)

    async def _amain(self, cls: type | None, args: Any, kwargs: Any) -> None:
        """Dispatch: concurrent endpoints start at once, everything else runs in order."""
        if cls is not None:
            self._construct(cls, args, kwargs)
        assert self._aq is not None and self._loop is not None
        serial: asyncio.Queue[_Item] = asyncio.Queue()
        worker = self._loop.create_task(self._serial(serial))
        self.serial_task = worker  # only its waits block the actor (concurrent tasks' do not)
        while True:
            item = await self._aq.get()
            if type(item) is Message and self._is_concurrent(item):
                try:
                    prepared = self._prepare(item)
                except BaseException as e:
                    self._internal_error(item, e)
                    continue
                if prepared is not None:
                    task = self._loop.create_task(self._invoke_async(*prepared))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                continue
            serial.put_nowait(item)
            if type(item) is _Stop:
                break
        await worker

    def _is_concurrent(self, frame: Message) -> bool:
        prop = self.endpoints.get(frame.header.method)
        return prop is not None and prop.concurrent and self.failed is None

    async def _serial(self, serial: asyncio.Queue[_Item]) -> None:
        """Run the non-concurrent items one at a time, each to completion."""
        while True:
            if serial.empty():
                self.rt.flush_held()  # idle now: replies held for a batched write go out
            item = await serial.get()
            if type(item) is Message:
                try:
                    prepared = self._prepare(item)
                    if prepared is not None:
                        await self._invoke_async(*prepared)
                except BaseException as e:  # a bug of ours: fail loudly, never die silently
                    self._internal_error(item, e)
            elif type(item) is _Stop:
                await self._cancel_tasks()
                # Waiting for the children must not block this actor's event loop. Only
                # when there are any: at interpreter exit (an actor of the client stopped
                # by the at-exit handler) the default executor can no longer start.
                inst = self.ctx_instance
                if inst is not None and any(owned.owned_by(inst.actor_id)):
                    await asyncio.get_running_loop().run_in_executor(
                        None, self._stop_children, item.reason
                    )
                await self._cleanup_async(None if self.failed is None else self.fail_exc)
                self._finish(item, None)
                return
            else:
                arg, fn, done = self._hook_for(item)
                try:
                    r = fn(arg) if fn is not None else False
                    if inspect.isawaitable(r):
                        r = await r
                    done(arg, bool(r), None)
                except Exception as e:
                    done(arg, False, e)
            if self.failed is not None and not self._cleaned:
                deadline = time.monotonic() + config.get("stop_proc_timeout")
                stopping = self.owned_stopping
                while stopping is not None and stopping.is_alive() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)  # the meshes it owned stop first
                await self._cleanup_async(self.fail_exc)

    def _hook_for(
        self, item: object
    ) -> tuple[Any, Any, Callable[[Any, bool, BaseException | None], None]]:
        """``(argument, hook or None, what to call with its outcome)`` for a hook item."""
        if type(item) is _Supervise:
            return item.failure, self._hook("__supervise__"), self._supervise_done
        if type(item) is _Bounced:
            return item.envelope, self._hook("_handle_undeliverable_message"), self._bounced_done
        raise TypeError(f"actor {self._label()}: not an inbox item: {item!r:.200}")

    # -- handling one message -------------------------------------------

    def _prepare(self, frame: Message) -> tuple[Any, ...] | None:
        """Decode a call; reply and return None if it cannot run."""
        _, _, method, port, index, labels, sizes, sender, chain, flags, carried = frame.header
        self._gate.taken(frame_bytes(frame))
        with self._lock:
            self._queued.pop(id(frame), None)
            arrived = self._arrived.pop(id(frame), None) if self._arrived else None
            if id(frame) in self._answered:
                self._answered.discard(id(frame))
                return None
        if self.failed is not None:
            self._reply_error(port, index, self.failed)
            return None
        prop = self.endpoints.get(method)
        if prop is None and flags & FLAG_AS_ENDPOINT:
            prop = self._adhoc_endpoint(method, flags)
        if prop is None:
            self._reply_exc(
                port,
                index,
                AttributeError(f"{type(self.instance).__qualname__} has no endpoint {method!r}"),
            )
            return None
        wrapped = None
        try:
            decoded = _decode(frame)
            if type(decoded) is Wrapped:  # arguments handed off on this proc (handoff.py)
                wrapped = decoded
                args, kwargs = wrapped.open(frame.buffers, _decode_body)
            else:
                args, kwargs = decoded
        except BaseException as e:
            if wrapped is not None:
                wrapped.finish(error=e)
            self._reply_exc(port, index, e)
            return None
        assert self.ctx_instance is not None
        key = (index, labels, sizes)
        rank = self._points.get(key)
        if rank is None:  # points are immutable: one per (index, extent) seen
            rank = Point(index, Extent(list(labels), list(sizes)))
            if len(self._points) >= _POINTS_KEPT:
                self._points.clear()
            self._points[key] = rank
        set_context(Context(self.ctx_instance, rank, chain))
        if prop.explicit_response_port:  # the endpoint answers through the port itself
            reply_to: Port[Any] = Port(port, index) if port is not None else _DroppingPort()
            args = (reply_to, *args)
        row = None
        if arrived is not None:  # sampled for the messages table (rt.recent, on delivery)
            row = [
                arrived[0],
                0,
                0,
                self.mesh_id,
                self.rank,
                method,
                str(sender) if sender is not None else (port.proc.name if port else None),
                frame_bytes(frame),
                None,
                True,
                arrived[1],
            ]
        return prop, port, index, args, kwargs, wrapped, row, carried

    def _adhoc_endpoint(self, method: str, flags: int) -> EndpointProperty | None:
        """A method called through ``as_endpoint``: treat it as an endpoint."""
        key = (method, flags)
        if key not in self._adhoc:
            fn = getattr(type(self.instance), method, None)
            if not callable(fn):
                return None
            self._adhoc[key] = EndpointProperty(
                fn, explicit_response_port=bool(flags & FLAG_EXPLICIT)
            )
        return self._adhoc[key]

    def _handle_sync(self, frame: Message) -> None:
        prepared = self._prepare(frame)
        if prepared is None:
            return
        prop, port, index, args, kwargs, wrapped, row, carried = prepared
        # A call made inside a span (telemetry on): the endpoint runs in a child span.
        active = telemetry.endpoint_span(self, prop, carried) if carried else None
        t0 = time.perf_counter_ns()
        self.running = prop.name
        try:
            result = prop.fn(self.instance, *args, **kwargs)
            if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
                # a sync actor's endpoint returned a coroutine
                result = asyncio.run(_await(result))
        except BaseException as e:
            self._call_raised(e, prop, port, index, wrapped, t0, row, active)
            return
        self._call_returned(result, prop, port, index, wrapped, t0, row, active)

    def _call_returned(
        self,
        result: Any,
        prop: EndpointProperty,
        port: PortId | None,
        index: int,
        wrapped: Wrapped | None,
        t0: int,
        row: list[Any] | None = None,
        active: Any = None,
    ) -> None:
        """An endpoint's body returned ``result`` (sync and async actors alike); ``active``:
        the span telemetry started for it (ended here)."""
        if active is not None:
            telemetry.end_endpoint_span(active, None)
        if wrapped is not None:
            wrapped.finish(result if wrapped.returns else None)
        self._debug_finish(None)
        self._measured(prop.name, t0, True, port, index, row, active)
        if port is not None and not prop.explicit_response_port:
            n = self.rt.reply(port, index, STATUS_OK, result)
            if row is not None:
                row[8] = n

    def _call_raised(
        self,
        e: BaseException,
        prop: EndpointProperty,
        port: PortId | None,
        index: int,
        wrapped: Wrapped | None,
        t0: int,
        row: list[Any] | None = None,
        active: Any = None,
    ) -> None:
        """An endpoint's body raised ``e`` (sync and async actors alike); ``active`` as for
        :meth:`_call_returned`."""
        if active is not None:
            telemetry.end_endpoint_span(active, e)
        if wrapped is not None:
            wrapped.finish(error=e)
        self._debug_finish(e)
        self._measured(prop.name, t0, False, port, index, row, active)
        if wrapped is not None and wrapped.returns and isinstance(e, Exception):
            return  # the producers record it (rref): the actor does not fail
        self._raised(e, prop, port, index)

    def _measured(
        self,
        name: str,
        t0: int,
        ok: bool,
        port: PortId | None,
        index: int,
        row: list[Any] | None = None,
        active: Any = None,
    ) -> None:
        """Count one execution of endpoint ``name`` (metrics), and trace it (when tracing);
        ``row``: the call's row for the messages table, when it was sampled; ``active``:
        its OpenTelemetry span, when the call carried a trace context. A sampled or
        traced call is kept as a span of the spans table too (issue 41: it was empty)."""
        self.running = None
        if self.rt.metrics:
            t1 = time.perf_counter_ns()
            st = self.stats.get(name)
            if st is None:
                st = self.stats[name] = EndpointStats()
            seconds = (t1 - t0) * 1e-9
            st.record(seconds, ok)
            if row is not None or active is not None:
                recent = self.rt.recent
                if row is not None:
                    row[1], row[2], row[9] = t0, t1, ok
                    if recent is not None:
                        recent.messages.append(row)
                if recent is not None:
                    self._keep_span(recent, name, t0, t1, ok, active)
                if telemetry.ON:  # the same over OTLP, as OpenTelemetry instruments
                    telemetry.endpoint_measured(self, name, seconds)
        tracer = self.rt.tracer
        if tracer is not None:
            flow = f"c:{port.proc.name}:{port.port}:{index}" if port is not None else None
            args = {"actor": self._label(), "ok": ok}
            tracer.span(f"{self.display_name}.{name}", "execute", t0, args, flow_in=flow)

    def _keep_span(self, recent: Any, name: str, t0: int, t1: int, ok: bool, active: Any) -> None:
        """Keep the span of one handled call in the spans table (``rt.recent``), with
        its OpenTelemetry ids when the call was traced."""
        trace_id = span_id = parent_id = None
        if active is not None and active[0] is not None:
            trace_id, span_id, parent_id = telemetry.ids_of(active[0])
        cls = type(self.instance).__name__
        recent.span(
            f"{cls}.{name}",
            t0,
            t1,
            f"{self.display_name}[{self.rank}]",
            trace_id,
            span_id,
            parent_id,
            {"endpoint": name, "class": cls, "ok": ok, "kind": "endpoint"},
        )

    async def _cancel_tasks(self) -> None:
        """Cancel the bodies of concurrent endpoints still running (before __cleanup__).

        Waits until every body has finished, its cancellation handlers included.
        """
        self.stopping = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _invoke_async(
        self,
        prop: EndpointProperty,
        port: PortId | None,
        index: int,
        args: Any,
        kwargs: Any,
        wrapped: Wrapped | None = None,
        row: list[Any] | None = None,
        carried: Any = None,
    ) -> None:
        active = telemetry.endpoint_span(self, prop, carried) if carried else None
        t0 = time.perf_counter_ns()
        self.running = prop.name
        try:
            result = prop.fn(self.instance, *args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except BaseException as e:
            self._call_raised(e, prop, port, index, wrapped, t0, row, active)
            return
        self._call_returned(result, prop, port, index, wrapped, t0, row, active)

    def _debug_finish(self, exc: BaseException | None) -> None:
        """End the pdb session breakpoint() opened in this endpoint (post-mortem on ``exc``)."""
        if self.debugging is not None:  # the common case costs one attribute read
            self.debugging.endpoint_done(self, exc)

    def _stop_children(self, reason: str) -> None:
        if self.ctx_instance is not None:
            owned.stop_owned(self.ctx_instance.actor_id, f"its owner stopped: {reason}")

    # -- stopping ---------------------------------------------------------

    def _owned_stopped(self) -> None:
        """After a failure: wait until the meshes it owned have stopped (bounded)."""
        stopping = self.owned_stopping
        if stopping is not None:
            stopping.join(config.get("stop_proc_timeout"))

    def _cleanup_sync(self, exc: BaseException | None) -> None:
        """``__cleanup__(exc)``, once: at a stop (``None``, or the failure's exception)
        or right after the actor failed (its thread)."""
        if self._cleaned:
            return
        self._cleaned = True
        fn = getattr(self.instance, "__cleanup__", None)
        if fn is None:
            return
        try:
            r = fn(exc)
            if inspect.isawaitable(r):
                asyncio.run(_await(r))
        except Exception:
            log.exception("__cleanup__ of actor %s raised", self._label())

    async def _cleanup_async(self, exc: BaseException | None) -> None:
        if self._cleaned:
            return
        self._cleaned = True
        fn = getattr(self.instance, "__cleanup__", None)
        if fn is None:
            return
        try:
            r = fn(exc)
            if inspect.isawaitable(r):
                await r
        except Exception:
            log.exception("__cleanup__ of actor %s raised", self._label())

    def _finish(self, item: _Stop, cleanup: Callable[[BaseException | None], None] | None) -> None:
        port, index = item.port, item.slot
        if cleanup is not None and self.instance is not None:
            cleanup(None if self.failed is None else self.fail_exc)
        with self._lock:
            self.stopped = True
        while True:  # whatever arrived behind the stop is answered, never dropped
            try:
                self._refuse(self._q.get_nowait())
            except queue.Empty:
                break
        ports, self._ports = self._ports, set()
        for no in ports:  # later sends to them come back to their senders
            self.rt.close_port(no)
        self._release()
        if port is not None:
            self.rt.reply(port, index, STATUS_OK, None)

    def _release(self) -> None:
        """Drop what a stopped actor holds; the cell stays only to answer "was stopped"."""
        self._gate.close()
        self.instance = None
        self.spawn_frame = None  # type: ignore[assignment]
        self.endpoints = {}
        self._adhoc.clear()
        self._queued.clear()
        self._arrived.clear()


async def _await(aw: Any) -> Any:
    return await aw


def _call_hook(fn: Any, arg: Any) -> tuple[bool, BaseException | None]:
    """Run a sync (or, from a sync actor, async) hook; ``(truthy result, exception)``."""
    if fn is None:
        return False, None
    try:
        r = fn(arg)
        if inspect.isawaitable(r):
            r = asyncio.run(_await(r))
        return bool(r), None
    except Exception as e:
        return False, e


_IDLE_READ = 1.0  # s: an idle actor's direct read returns this often (and starts again)


def _single(sizes: tuple[int, ...]) -> bool:
    """A call addressed to one actor (``call_one``, a one-actor mesh), not to several."""
    # A malformed header (a buggy peer) fails later, in _prepare, and is answered there.
    return type(sizes) is tuple and sizes.count(1) == len(sizes)


def _queued(q: queue.SimpleQueue[_Item]) -> Callable[[], bool]:
    return lambda: not q.empty()
