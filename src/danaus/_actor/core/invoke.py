"""The invoke step: one decoded call runs an endpoint's body and yields an outcome.

The cell takes a call from its inbox, decodes it into an `Invocation` (the
endpoint, where to reply, the arguments), runs it with `invoke()` (sync
actors) or `invoke_async()` (async actors), and settles the
`Outcome`: it replies with the value, or answers or fails on the
exception. The body's own frames are what a remote traceback shows: the frames
of this module and of the cell above it are danaus's, which
``frames.user_traceback`` leaves out.

Unpickling a spawn or a call may import a module for the first time, so it is
done under one process-wide lock (`decode()`).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import Any, NamedTuple

from ..._mesh import Extent, Point
from ..._runtime.messaging.metrics import MessageRow
from ..._wire import codec
from ..._wire.ids import PortId
from ..._wire.protocol import Message
from .context import Context, Instance
from .endpoints import EndpointProperty
from .handoff import Wrapped

__all__ = [
    "Contexts",
    "Invocation",
    "Outcome",
    "decode",
    "decode_body",
    "invoke",
    "invoke_async",
    "record",
    "run_awaitable",
]


class Invocation(NamedTuple):
    """A call taken from the inbox, decoded, ready to run."""

    prop: EndpointProperty  # the endpoint
    port: PortId | None  # where its reply goes (None: a broadcast, no reply)
    slot: int  # the reply's slot at that port (the rank it is for)
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    wrapped: Wrapped | None  # the handoff its arguments came in (``handoff.py``), if any
    row: MessageRow | None  # its row of the messages table, when it was sampled
    carried: Any  # the trace context it carries (telemetry on), if any


class Outcome(NamedTuple):
    """How a call's body ended: it returned ``value``, or raised ``error``
    (a ``CancelledError`` when its actor's stop cancelled it)."""

    value: Any
    error: BaseException | None
    t0: int  # ``time.perf_counter_ns()`` when the body started

    @property
    def ok(self) -> bool:
        return self.error is None


# Results that are certainly not awaitable (skips inspect's ABC check per call).
_PLAIN_RESULTS = frozenset({type(None), bool, int, float, str, bytes, tuple, list, dict})


# The records are made with ``tuple.__new__`` on the hot path: a NamedTuple's own
# ``__new__`` is a Python function, one more call per message for the same tuple.
record = tuple.__new__


def invoke(instance: Any, call: Invocation) -> Outcome:
    """Run ``call``'s body on the sync actor ``instance`` (the actor's thread); a body
    that returns a coroutine is run to completion here."""
    prop, _, _, args, kwargs, _, _, _ = call  # its fields, unpacked at once
    t0 = time.perf_counter_ns()
    try:
        result = prop.fn(instance, *args, **kwargs)
        if type(result) not in _PLAIN_RESULTS and inspect.isawaitable(result):
            result = run_awaitable(result)
    except BaseException as e:
        return record(Outcome, (None, e, t0))
    return record(Outcome, (result, None, t0))


async def invoke_async(instance: Any, call: Invocation) -> Outcome:
    """Run ``call``'s body on the async actor ``instance`` (on the actor's loop)."""
    prop, _, _, args, kwargs, _, _, _ = call
    t0 = time.perf_counter_ns()
    try:
        result = prop.fn(instance, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
    except BaseException as e:
        return record(Outcome, (None, e, t0))
    return record(Outcome, (result, None, t0))


def run_awaitable(aw: Any) -> Any:
    """Await ``aw`` on a fresh event loop (from a sync actor's thread)."""
    return asyncio.run(_await(aw))


async def _await(aw: Any) -> Any:
    return await aw


_CONTEXTS_KEPT = 256


class Contexts(dict[tuple[Any, ...], Context]):
    """The contexts an actor's calls run in, by ``(index, labels, sizes, chain)``: built
    once per key seen (``contexts[key]``), since a context is immutable and most calls
    come from the same few meshes and chains. A dict, so a hit costs what a dict's
    lookup does, and no ``Context`` nor ``Point`` is made per call. ``instance`` is
    the actor's, set once it is constructed."""

    __slots__ = ("instance",)

    def __init__(self) -> None:
        super().__init__()
        self.instance: Instance | None = None

    def __missing__(self, key: tuple[Any, ...]) -> Context:
        index, labels, sizes, chain = key
        assert self.instance is not None
        ctx = Context(self.instance, Point(index, Extent(list(labels), list(sizes))), chain)
        if len(self) >= _CONTEXTS_KEPT:
            self.clear()
        self[key] = ctx
        return ctx


# Unpickling a spawn or a call may import a module for the first time. Python's
# per-module import locks do not make that safe when several actor threads do
# it at once: a thread importing ``pkg.sub`` while another is still running
# ``pkg/__init__`` sees ``pkg`` half initialised ("partially initialized
# module", as torch fails). The import system is process-wide state, so one
# process-wide lock serialises decoding; an uncontended acquire costs ~0.1 us.
_DECODE_LOCK = threading.RLock()


def decode(frame: Message) -> Any:
    """Unpickle a frame's body, one actor thread of this proc at a time."""
    with _DECODE_LOCK:
        return codec.loads(frame.body, frame.buffers)


def decode_body(body: bytes, buffers: Any) -> Any:
    """Unpickle a wrapped call's arguments (``handoff.Wrapped``) under the same lock."""
    with _DECODE_LOCK:
        return codec.loads(body, buffers)
