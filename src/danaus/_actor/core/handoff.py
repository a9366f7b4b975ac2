"""Handoffs: endpoint arguments that only the receiving proc can supply, in order with it.

A higher layer (the tensor engine) lets objects that stand for per-proc
values (a distributed tensor, whose value on each proc is that proc's local
shard) be passed as endpoint arguments. The actor core knows nothing of
tensors; it only runs this protocol:

- **Sender.** ``Endpoint`` pickles a call's arguments inside `capture()`.
  Such an object's ``__reduce_ex__`` calls `refer()` with itself and its
  *provider*, and pickles as "the ``i``-th handed-off value". When the
  arguments are pickled, each provider's ``hand_off(key, count, refs, recipients)``
  is told which actors will receive the message (it raises to refuse the
  call, before anything is sent), and the body is wrapped in a
  `Wrapped` naming ``key``.
- **Producer.** On each receiving proc, the provider's own machinery (a
  tensor-engine stream) calls `offer()` when it reaches the point the
  client issued the call at; ``offer`` blocks that producer until the
  endpoint has returned, so what the producer runs next sees what the
  endpoint did. It gives up if the actor stops or fails without running the
  call (nothing hangs on a message that will never run).
- **Receiver.** The actor's cell, on its own thread and not under the decode
  lock, waits for the offered values (`Wrapped.open()`), unpickles the
  arguments with them in place, runs the endpoint, then calls
  `Wrapped.finish()`.

    client ── hand_off: command ──▶ producer (stream)  ── offer(key) ─┐ waits for finish
           ── call(Wrapped(key)) ─▶ actor: open(key) ◀─ values ───────┘
                                     run endpoint; finish(key) ──▶ producer goes on

A call may also hand its *result* to the producers (``endpoint.rref``: the
endpoint's return value becomes a distributed tensor): the sender passes
its own ``hand_off`` to `Capture.wrap()`, which then wraps the body even
when no argument is handed off, marks it ``returns``, and the actor's cell
gives `Wrapped.finish()` the endpoint's result or exception, which
`offer()` returns to the producer. Such a call has no reply port: its
outcome goes to the producers only, and an endpoint that raises does not
fail its actor (the producer records the exception instead).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from ... import _config as config
from ..._runtime.node import Node
from ..._wire import codec

__all__ = [
    "Capture",
    "Recipients",
    "Wrapped",
    "capture",
    "offer",
    "refer",
]


class Recipients(NamedTuple):
    """The actors one message goes to: ``actors`` is ``(rank, proc)`` per addressed actor."""

    mesh_id: str
    what: str  # "Counter.incr()", for error messages
    actors: tuple[tuple[int, Any], ...]


# Per thread, not a node part: the capture of the call being pickled, and the values
# handed off to the call being unpickled, on this thread (each lasts one call).
_local = threading.local()


def _handed(index: int) -> Any:
    """Unpickling a reference: the value handed off for it (set by ``Wrapped.open``)."""
    values = getattr(_local, "values", None)
    if values is None:
        raise RuntimeError(
            "a handed-off argument (a distributed tensor) was unpickled outside the endpoint "
            "call it was sent with; such values can only be endpoint arguments"
        )
    return values[index]


class Capture:
    """The handed-off references met while pickling one call's arguments."""

    def __init__(self) -> None:
        self.refs: list[tuple[Any, Any]] = []  # (provider, obj), by index

    def add(self, obj: Any, provider: Any) -> tuple[Any, tuple[int]]:
        self.refs.append((provider, obj))
        return _handed, (len(self.refs) - 1,)

    def wrap(
        self,
        node: Node,
        payload: tuple[bytes, list[Any]],
        recipients: Recipients,
        hand_off: Callable[[str, int, list[tuple[int, Any]], Recipients], None] | None = None,
    ) -> Any:
        """Tell each provider where the call goes; the payload, wrapped. Raises to refuse.

        With ``hand_off``, that alone is told, of every reference (there may be
        none), and the endpoint's result goes back to the producers
        (``Wrapped.returns``).
        """
        key = f"{node.runtime.proc_id.name}:{next(node.part(Handoffs).keys)}"
        if hand_off is not None:
            hand_off(key, len(self.refs), list(enumerate(obj for _, obj in self.refs)), recipients)
        else:
            by_provider: dict[int, tuple[Any, list[tuple[int, Any]]]] = {}
            for i, (provider, obj) in enumerate(self.refs):
                by_provider.setdefault(id(provider), (provider, []))[1].append((i, obj))
            for provider, refs in by_provider.values():
                provider.hand_off(key, len(self.refs), refs, recipients)
        body, bufs = payload
        wrapped = Wrapped(key, len(self.refs), bytes(body), returns=hand_off is not None)
        outer, extra = codec.dumps(wrapped)
        if extra:  # the payload's buffers travel as ``bufs``: nothing else may
            raise RuntimeError(f"a wrapped call pickled {len(extra)} buffers of its own")
        return outer, bufs


@contextlib.contextmanager
def capture() -> Iterator[Capture]:
    """Collect the references pickled on this thread until the block ends."""
    previous = getattr(_local, "capture", None)
    cap = _local.capture = Capture()
    try:
        yield cap
    finally:
        _local.capture = previous


def refer(obj: Any, provider: Any) -> tuple[Any, tuple[int]] | None:
    """From ``obj.__reduce_ex__``: pickle ``obj`` as a handed-off argument.

    Returns the reduction, or ``None`` when ``obj`` is not being pickled as an
    endpoint's argument (the caller raises its own error then).
    """
    cap = getattr(_local, "capture", None)
    if cap is None:
        return None
    return cap.add(obj, provider)  # type: ignore[no-any-return]


class _Slot:
    __slots__ = ("done", "error", "outcome", "ready", "values")

    def __init__(self) -> None:
        self.values: dict[int, Any] = {}
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.done = threading.Event()
        # What the endpoint did, set before ``done``: (True, result) or (False, exception).
        self.outcome: tuple[bool, Any] = (False, RuntimeError("the endpoint did not run"))


class Handoffs:
    """This proc's handoffs in progress, by key (a part of the node)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards slots and each slot's values and error
        self.slots: dict[str, _Slot] = {}
        self.keys = itertools.count(1)  # a client's calls with handed-off arguments

    def slot(self, key: str) -> _Slot:
        with self.lock:
            s = self.slots.get(key)
            if s is None:
                s = self.slots[key] = _Slot()
            return s

    def forget(self, key: str) -> None:
        with self.lock:
            self.slots.pop(key, None)


class Wrapped:
    """A call's pickled arguments that wait for handed-off values (what the actor receives)."""

    def __init__(self, key: str, count: int, body: bytes, returns: bool = False) -> None:
        self.key = key
        self.count = count
        self.body = body
        self.returns = returns  # the endpoint's outcome goes to the producers (rref)

    def open(self, node: Node, buffers: Any, decode: Any) -> Any:
        """Wait for the values, then unpickle the arguments with them (``decode(body, bufs)``).

        Raises what a producer offered instead of a value (its input failed).
        """
        slot = node.part(Handoffs).slot(self.key)
        slot.ready.wait()
        if slot.error is not None:
            raise slot.error
        _local.values = slot.values
        try:
            return decode(self.body, buffers)
        finally:
            _local.values = None

    def finish(self, node: Node, result: Any = None, error: BaseException | None = None) -> None:
        """The endpoint has returned ``result`` or raised ``error`` (or could not run, with
        ``error`` saying why): the producers go on, and `offer()` returns that."""
        h = node.part(Handoffs)
        slot = h.slot(self.key)
        h.forget(self.key)
        slot.outcome = (True, result) if error is None else (False, error)
        slot.done.set()


def offer(
    node: Node,
    key: str,
    count: int,
    values: dict[int, Any] | BaseException,
    mesh_id: str,
    rank: int,
) -> tuple[bool, Any] | None:
    """On a producer's thread: hand ``values`` (index -> value) to the call ``key``, then wait.

    ``values`` may be an exception, which the call then raises. Several
    producers may each offer some of the ``count`` values. Once the endpoint
    has returned, returns ``(True, its result)`` or ``(False, the exception)``
    (the result is only kept for a call that ``returns``; ``None`` otherwise);
    ``None`` if the actor ``(mesh_id, rank)`` of this proc stopped or failed
    without running the call.
    """
    h = node.part(Handoffs)
    slot = h.slot(key)
    with h.lock:
        if isinstance(values, BaseException):
            slot.error = slot.error or values
        else:
            slot.values.update(values)
        if slot.error is not None or len(slot.values) >= count:
            slot.ready.set()
    rt = node.runtime
    poll = config.get("handoff_poll_interval")
    while not slot.done.wait(poll):
        mailbox = rt.router.mailboxes.get((mesh_id, rank))
        if mailbox is None:
            continue  # its spawn has not arrived yet
        if getattr(mailbox, "stopped", True) or getattr(mailbox, "failed", None) is not None:
            h.forget(key)  # a tombstone, a stopped or a failed actor: the call will not run
            return None
    return slot.outcome
