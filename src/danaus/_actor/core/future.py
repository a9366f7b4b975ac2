"""Future: the result of a call, usable from threads (``get``) and from asyncio (``await``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import math
import threading
import time
import warnings
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..._runtime.messaging.runtime import Runtime
from ..._runtime.node import this_node
from .context import _current
from .deferred import Deferred, resolve
from .waiting import Reader, Waits

if TYPE_CHECKING:
    from ..._runtime.messaging.runtime import Runtime

R = TypeVar("R")

__all__ = ["Deferred", "Future", "Pending", "resolve"]


class Pending:
    """A one-shot result slot: the part of ``concurrent.futures.Future`` danaus uses.

    ``done``, ``result(timeout)``, ``exception(timeout)``, ``add_done_callback``,
    ``set_result``, ``set_exception`` behave as the standard future's (the
    first ``set_*`` wins, a second raises ``InvalidStateError``; a timeout
    raises ``TimeoutError``). It costs a few slots instead of a ``Condition``
    with its own lock and lists: a call to one actor makes one per call. Its
    state changes under one lock shared by all of them (held for a few
    operations, never while a callback runs or a waiter blocks), not one lock
    each: every object the garbage collector tracks per call makes its
    collections more frequent in a pipelined batch. Waiters block on a lock
    of their own, made only when they wait.
    """

    __slots__ = ("_callbacks", "_done", "_ok", "_value", "_waiters", "reader", "runtime")
    # Guards every Pending's state: _done, _ok, _value, _callbacks and _waiters.
    _lock = threading.Lock()

    def __init__(self) -> None:
        # Set by the caller that sent the message: the connection its result will come
        # on, when a waiter may read it itself (``Connection.read_directly``), and the
        # runtime it was sent from, which a waiter outside any actor tells that it
        # waits (its `Waits`: the runtime of this process's node, found without a lookup).
        self.reader: Reader | None = None
        self.runtime: Runtime | None = None
        self._done = False
        self._ok = False
        self._value: Any = None
        self._waiters: list[threading.Lock] | None = None
        self._callbacks: list[Callable[[Any], Any]] | None = None

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return not self._done

    def cancel(self) -> bool:
        return False

    def set_result(self, value: Any) -> None:
        self.complete(True, value)

    def set_exception(self, exc: BaseException) -> None:
        self.complete(False, exc)

    def complete(self, ok: bool, value: Any) -> None:
        """``set_result(value)`` if ``ok``, else ``set_exception(value)``."""
        with self._lock:
            if self._done:
                raise concurrent.futures.InvalidStateError(f"{self!r} is already done")
            self._ok = ok
            self._value = value
            self._done = True
            waiters, self._waiters = self._waiters, None
            callbacks, self._callbacks = self._callbacks, None
        if waiters:
            for w in waiters:
                w.release()
        if callbacks:
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:  # as concurrent.futures: a callback's error is not ours
                    _log_callback_error(fn)

    def _wait(self, timeout: float | None) -> None:
        if self._done:
            return
        w = threading.Lock()  # guards no state: a signal, released when this Pending completes
        w.acquire()
        with self._lock:
            if self._done:
                return
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(w)
        if w.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            return
        with self._lock:
            if self._waiters is not None and w in self._waiters:
                self._waiters.remove(w)
        if not self._done:
            raise concurrent.futures.TimeoutError()

    def result(self, timeout: float | None = None) -> Any:
        if not self._done:
            self._wait(timeout)
        if self._ok:
            return self._value
        raise self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._done:
            self._wait(timeout)
        return None if self._ok else self._value

    def add_done_callback(self, fn: Callable[[Any], Any]) -> None:
        with self._lock:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def __repr__(self) -> str:
        return f"<Pending {'done' if self._done else 'pending'}>"


def _log_callback_error(fn: Any) -> None:
    logging.getLogger("concurrent.futures").exception("exception calling callback for %r", fn)


class Future(Generic[R]):
    """The eventual result of an actor call.

    ``get(timeout=None)`` blocks the calling thread; ``await fut`` suspends an
    asyncio task. A timeout raises ``TimeoutError`` and leaves the future
    usable: a later ``get`` or ``await`` still returns the value. Futures are
    made by danaus (endpoint adverbs, ``initialized``, ``stop()``), or from a
    coroutine with ``Future(coro=...)`` (as Monarch's main branch allows): the
    coroutine runs once, when the future is first waited for — on the awaiting
    task's event loop for ``await``, on a thread of its own for ``get()``.
    RDMA transfers (``read_into``, ``write_from``, ``RDMAAction.submit``) start
    the same way, as in Monarch: when first waited for, so awaiting a write
    before an earlier-issued read runs the write first.

    Example:

        value = counter.value.call_one().get(timeout=10)
        value = await counter.value.call_one()

        async def both():
            return await a.value.call_one() + await b.value.call_one()

        total = Future(coro=both()).get()
    """

    __slots__ = ("_cf", "_coro", "_steps", "_what")
    _cf: concurrent.futures.Future[Any]
    _what: str

    def __init__(self, *args: Any, coro: Any = None, **kwargs: Any) -> None:
        if args or kwargs or coro is None:
            given = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
            raise TypeError(
                f"Future({given}) is not a way to make a future; build one from a coroutine "
                "with Future(coro=my_coroutine()), or use the futures returned by endpoint "
                "calls (mesh.method.call(...)), .initialized and .stop()"
            )
        if not inspect.isawaitable(coro):
            raise TypeError(
                f"Future(coro=...) needs a coroutine (the result of calling an 'async def' "
                f"function), got {coro!r}"
            )
        self._cf = concurrent.futures.Future()
        self._coro: Any = coro  # taken (set to None) by whoever first waits
        self._steps: Any = None  # driven as a coroutine (send/throw): its __await__
        self._what = f"coroutine {getattr(coro, '__qualname__', coro)!r}"

    @classmethod
    def _create(cls, cf: Any, what: str) -> Future[Any]:
        """Wrap ``cf``: a ``concurrent.futures.Future`` or a `Pending`."""
        self: Future[Any] = object.__new__(cls)
        self._cf = cf
        self._coro = None
        self._steps = None
        self._what = what
        return self

    @classmethod
    def _lazy(cls, cf: Any, start: Callable[[], None], what: str) -> Future[Any]:
        """A future of ``cf`` whose work, ``start()`` (which completes ``cf``), begins
        when it is first waited for: Monarch's rule for a future made from a coroutine."""
        self = cls._create(cf, what)
        self._coro = _Starter(start)
        return self

    def _start(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Run the coroutine of a ``Future(coro=...)``, once: on ``loop``, else on a thread."""
        with _START_LOCK:
            coro, self._coro = self._coro, None
        if coro is None:
            return
        if isinstance(coro, _Starter):  # a lazy future of danaus's own: start it here
            try:
                coro.start()
            except BaseException as e:
                if not self._cf.done():
                    self._cf.set_exception(e)
            return
        if loop is not None:
            loop.create_task(_drive(coro, self._cf))
        else:
            threading.Thread(
                target=asyncio.run,
                args=(_drive(coro, self._cf),),
                daemon=True,
                name=f"danaus-future-{self._what}",
            ).start()

    @classmethod
    def _resolved(cls, value: Any, what: str = "value") -> Future[Any]:
        cf: concurrent.futures.Future[Any] = concurrent.futures.Future()
        cf.set_result(value)
        return cls._create(cf, what)

    def get(self, timeout: float | None = None) -> R:
        """Block until the result is ready and return it (or raise the call's exception).

        Raises ``TimeoutError`` after ``timeout`` seconds (the future stays usable),
        ``ValueError`` for a negative or non-finite timeout.
        """
        if timeout is not None and (not math.isfinite(timeout) or timeout < 0):
            raise ValueError(f"timeout must be a finite number >= 0 or None, got {timeout!r}")
        cf = self._cf
        if cf.done():  # nothing to wait for
            rt = getattr(cf, "runtime", None) or _runtime()
            if rt is not None:
                # a result was taken: what this thread sends next is not a burst
                rt.transport.batching.flush_held()
            exc = cf.exception()
            if exc is None:
                value = cf.result()
                if isinstance(value, Deferred):  # a reply as received: decode it here
                    try:
                        decoded = value.resolve()
                    except Exception as e:
                        raise _clean(e) from e.__cause__
                    if isinstance(cf, Pending):
                        # Keep the value, not the reply it came in: one object less
                        # for the garbage collector while the future lives.
                        cf._value = decoded
                    return decoded  # type: ignore[no-any-return]
                return value  # type: ignore[no-any-return]
            raise _clean(exc) from (None if isinstance(exc, TimeoutError) else exc.__cause__)
        if self._coro is not None:
            self._start(None)
        if _running_loop() is not None and not self._cf.done():
            _check_not_io_thread()
            warnings.warn(
                "Future.get() blocks the thread of a running asyncio event loop; "
                "use 'await fut' instead",
                UserWarning,
                stacklevel=2,
            )
        # Every exception of the call is raised from this frame, not from the ones that
        # waited: the caller's traceback ends at their get(), not in danaus's insides.
        try:
            raw = self._wait_raw(timeout)
        except concurrent.futures.TimeoutError:
            if self._cf.done():  # the call itself raised a TimeoutError
                exc = self._cf.exception()
                if exc is None:  # raised by its reader (a Deferred): already clean
                    raise
                raise _clean(exc) from None
            raise TimeoutError(
                f"timed out after {timeout} s waiting for {self._what}; the future is still "
                "usable: call get() again or await it"
            ) from None
        except BaseException as e:
            if e is self._cf.exception():
                raise _clean(e) from e.__cause__
            raise
        if isinstance(raw, Deferred):  # a reply as received: decode it here
            try:
                return raw.resolve()  # type: ignore[no-any-return]
            except Exception as e:
                raise _clean(e) from e.__cause__
        return raw

    def _wait(self, timeout: float | None) -> R:
        """The result, waited for with `_wait_raw()`; a `Deferred` result (a
        reply as received) is decoded here, on the waiting thread."""
        raw = self._wait_raw(timeout)
        if isinstance(raw, Deferred):
            try:
                return raw.resolve()  # type: ignore[no-any-return]
            except Exception as e:
                raise _clean(e) from e.__cause__
        return raw

    def _wait_raw(self, timeout: float | None) -> R:
        """``result(timeout)``, waking up now and then so the interpreter can deliver an
        asynchronous exit (an unhandled failure ends the program from another thread).

        It talks to two narrow interfaces: the `Waits` of this thread (told
        before and after it blocks) and the result's `Reader`, if it has one."""
        cf = self._cf
        waits = _waits(getattr(cf, "runtime", None))
        if waits is not None:
            waits.begin_wait()
        try:
            reader = getattr(cf, "reader", None)
            if reader is not None:
                # Read the connection the result will come on, on this thread, while no
                # other thread does (saves waking the I/O thread and then this one).
                # The usual wait below takes over if the connection cannot be read here
                # (busy, closing) or when the time is up.
                deadline = None if timeout is None else time.monotonic() + timeout
                done = cf.done
                while True:
                    left = _WAKE if deadline is None else min(_WAKE, deadline - time.monotonic())
                    # On: it read, and the result is not in yet.
                    if left <= 0 or reader.read_directly(done, left) is not False:
                        break
                if deadline is not None:
                    timeout = max(0.0, deadline - time.monotonic())
            if timeout is None:
                while True:
                    try:
                        return self._cf.result(_WAKE)  # type: ignore[no-any-return]
                    except concurrent.futures.TimeoutError:
                        if self._cf.done():  # the call itself raised TimeoutError
                            raise
                        continue
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                try:
                    return self._cf.result(max(0.0, min(left, _WAKE)))  # type: ignore[no-any-return]
                except concurrent.futures.TimeoutError:
                    if self._cf.done() or left <= _WAKE:
                        raise
        finally:
            if waits is not None:
                waits.end_wait()

    result = get  # the same method, so an error's traceback has one frame of ours either way

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait like `get()`; return the exception the call raised, or ``None``."""
        try:
            self.get(timeout)
        except TimeoutError:
            if not self._cf.done():
                raise
            return self._cf.exception()
        except BaseException as e:
            return e
        return None

    def done(self) -> bool:
        return bool(self._cf.done())

    def add_done_callback(self, fn: Callable[[Future[R]], Any]) -> None:
        """Call ``fn(self)`` when done (on the thread that completes it)."""
        self._cf.add_done_callback(lambda _: fn(self))

    def as_asyncio(self) -> asyncio.Future[R]:
        """A fresh asyncio future of the running loop that completes with this one.

        Cancelling it does not affect this future or its other observers.
        """
        loop = asyncio.get_running_loop()
        if self._coro is not None:
            self._start(loop)
        afut: asyncio.Future[R] = loop.create_future()

        def transfer(cf: concurrent.futures.Future[Any]) -> None:
            if afut.cancelled():
                return
            exc = cf.exception()
            if exc is not None:
                afut.set_exception(_clean(exc))  # as get() raises it: no frames of ours
                return
            try:  # on the awaiting loop's thread: a reply is decoded here
                value = resolve(cf.result())
            except Exception as e:
                afut.set_exception(e.with_traceback(None))
            else:
                afut.set_result(value)

        def on_done(cf: concurrent.futures.Future[Any]) -> None:
            if loop.is_closed():
                return
            try:
                loop.call_soon_threadsafe(transfer, cf)
            except RuntimeError:  # the loop closed meanwhile
                pass

        self._cf.add_done_callback(on_done)
        return afut

    # -- a coroutine too ------------------------------------------------------------
    # Monarch declares some methods ``async def`` where danaus returns a Future
    # (``logging_option``, ``sync_workspace``), and programs hand their results to
    # ``asyncio.run`` or ``create_task``, which take coroutines only. With these three
    # methods every Future is one (``collections.abc.Coroutine``): a task drives it
    # exactly as it would ``await fut``.

    def send(self, value: Any) -> Any:
        """Coroutine protocol: one step of ``await self`` (for an asyncio task)."""
        if self._steps is None:
            self._steps = self.__await__()
        try:
            return self._steps.send(value)
        except BaseException:  # finished (StopIteration too): the next run starts afresh
            self._steps = None
            raise

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """Coroutine protocol: raise ``typ`` (or ``val``) where ``await self`` waits."""
        if self._steps is None:
            self._steps = self.__await__()
        exc = typ if val is None else val
        if isinstance(exc, type):
            exc = exc()
        try:
            return self._steps.throw(exc)
        except BaseException:
            self._steps = None
            raise

    def close(self) -> None:
        """Coroutine protocol: stop waiting as a coroutine (the future itself goes on)."""
        steps, self._steps = self._steps, None
        if steps is not None:
            steps.close()

    def __await__(self) -> Generator[Any, None, R]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise ValueError("'await' on a danaus Future needs a running asyncio loop") from None
        if self._cf.done():
            rt = _runtime()
            if rt is not None:
                # a result was taken: what this thread sends next is not a burst
                rt.transport.batching.flush_held()
            return (yield from self.as_asyncio().__await__())
        waits = _waits()
        if waits is not None:
            waits.begin_wait()
        try:
            return (yield from self.as_asyncio().__await__())
        finally:
            if waits is not None:
                waits.end_wait()

    def __repr__(self) -> str:
        state = "done" if self._cf.done() else "pending"
        return f"<danaus Future of {self._what} ({state})>"


_WAKE = 0.1  # seconds between wake-ups of a blocked get()
_START_LOCK = threading.Lock()  # guards each Future(coro=...)'s _coro, taken once to start it


class _Starter:
    """The deferred start of a `Future._lazy()` future."""

    __slots__ = ("start",)

    def __init__(self, start: Callable[[], None]) -> None:
        self.start = start


async def _drive(coro: Any, cf: concurrent.futures.Future[Any]) -> None:
    """Await ``coro`` and complete ``cf`` with its outcome."""
    try:
        value = await coro
    except BaseException as e:  # it belongs to whoever waits on the future
        cf.set_exception(e)
    else:
        cf.set_result(value)


def _clean(e: BaseException | None) -> BaseException:
    """The call's exception without danaus's waiting frames in its traceback."""
    assert e is not None
    return e.with_traceback(None)


_running_loop = asyncio.events._get_running_loop  # None outside a running loop (no raise)


def _waits(runtime: Runtime | None = None) -> Waits | None:
    """What this thread tells before and after it blocks on a result: the inbox of the
    actor whose serial path this is (which tells the runtime too: its backpressure
    lets go of what this thread may be waiting for), else the runtime's backpressure, if
    any (of ``runtime``, where the result knows it)."""
    ctx = _current.get()
    cell = ctx.actor_instance._cell if ctx is not None else None
    if cell is not None:
        waits: Waits | None = cell.waits()
        if waits is not None:
            return waits
    rt = runtime if runtime is not None else _runtime()
    return None if rt is None else rt.backpressure


def _runtime() -> Runtime | None:
    """This process's runtime, if its node has started (a wait needs no mesh to find it)."""
    node = this_node(start=False)
    return None if node is None else node.runtime


def _check_not_io_thread() -> None:
    loop = _running_loop()
    if loop is None:
        return
    rt = _runtime()
    if rt is not None and loop is rt.loop:
        raise RuntimeError(
            "Future.get() was called on danaus's I/O thread, which would deadlock; call it "
            "from an actor endpoint or the client's own threads"
        )
