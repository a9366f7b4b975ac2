"""``Stream``, ``get_active_stream`` and borrows: independent lines of work on every worker.

Every mesh tensor belongs to the stream that was active when it was made,
and ops run on the active stream; a worker runs each stream on its own
thread (and CUDA stream), so ops of different streams overlap. A tensor is
used on another stream only through ``stream.borrow(t)``, which returns a
handle on ``stream`` and a ``Borrow``: the borrowing stream waits (on the
worker) until the origin stream has run everything issued before the
borrow; ``borrow.drop()`` makes the origin stream wait until the borrowing
stream has run everything issued before the drop. While a mutable borrow is
live the origin cannot touch the tensor; while an immutable one is live
neither stream may write it. These rules are Monarch's and are checked on
the client, at the op.

As in Monarch (``StorageAliases`` in ``monarch/common/borrows.py``), the
rules hold per *storage*, not per handle: a tensor and every view of it on
its stream share one `Storage`, so borrowing a view (``x[0]``) locks
``x`` and its other views too, and a borrowed tensor is a new storage on the
borrowing stream whose views all end when the borrow is dropped.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from .._runtime.node import this_node
from .messages import BorrowCreate, BorrowDrop, Signal, Wait

__all__ = ["Borrow", "Storage", "Stream", "check_use", "get_active_stream"]

log = logging.getLogger("danaus.tensor")


class Stream:
    """A named stream of work on each worker: ``with Stream("comms").activate(): ...``."""

    def __init__(self, name: str, _default: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"Stream(name) needs a non-empty string, got {name!r}")
        self.name = name
        self.default = _default

    def activate(self) -> contextlib.AbstractContextManager[None]:
        """Make this the active stream until the ``with`` block ends. Does not block."""
        return _activate(self)

    def borrow(self, t: Any, mutable: bool = False) -> tuple[Any, Borrow]:
        """Use mesh tensor ``t`` on this stream: returns ``(view on this stream, borrow)``.

        Does not block. The view's first op on this stream runs after every op
        issued on ``t``'s stream before the borrow. With ``mutable=True`` this
        stream may write the view and ``t``'s stream may not use ``t`` until
        ``borrow.drop()``; otherwise both may read and neither write. Raises
        ``TypeError`` for a tensor that is not a mesh tensor, ``ValueError`` for
        one already on this stream or a borrow the live ones forbid.
        """
        # a mesh tensor makes its own view (``Tensor`` sits above this module: it uses streams)
        view_on = getattr(type(t), "_view_on", None)
        if view_on is None:
            raise TypeError(f"Stream.borrow needs a mesh tensor (danaus.Tensor), got {type(t)}")
        if t._stream is self:
            raise ValueError(
                f"{t!r} is already on {self!r}: borrow it onto another stream, or use it as is"
            )
        src = t._storage
        if "r" not in src.access:
            raise ValueError(
                f"Cannot borrow {t!r}: it (or a view of the same storage) is lent mutably to "
                "another stream, or its borrow was dropped"
            )
        if mutable and "w" not in src.access:
            raise ValueError(
                "Cannot borrow this tensor mutably because it (or a view of the same storage) "
                "is already being borrowed, or is itself an immutable borrow; drop the other "
                "borrow first"
            )
        engine, shape = t._engine, t._mesh._shape
        view = view_on(t, self)
        # the borrowed tensor's storage on this stream, shared by the views made from it;
        # set before BorrowCreate goes, so an engine that counts memory sees it
        view._storage = Storage("rw" if mutable else "r")
        key = engine.new_id()
        engine.send(shape, Signal(key), stream=t._stream.name)
        engine.send(shape, BorrowCreate(key, view._ref, t._ref), stream=self.name)
        borrow = Borrow(t, view, self, mutable)
        src.lend(mutable)
        return view, borrow

    def __repr__(self) -> str:
        return f"<Stream {self.name!r}>"


class Storage:
    """What a tensor and its views on one stream share: who may read and write it now.

    ``access`` holds ``"r"`` and/or ``"w"``: ``"rw"`` normally, ``"r"`` while
    immutably borrowed (or for an immutable borrow), ``""`` while lent
    mutably or once its borrow was dropped (then ``dropped`` is set).
    """

    __slots__ = ("access", "dropped", "live", "own_access")

    def __init__(self, access: str = "rw") -> None:
        self.access = access
        self.own_access = access  # what it returns to when its last borrow is dropped
        self.dropped = False
        self.live = 0  # borrows of it not yet dropped

    def lend(self, mutable: bool) -> None:
        self.live += 1
        self.access = "" if mutable else "r"

    def returned(self) -> None:
        self.live -= 1
        if self.live == 0:
            self.access = self.own_access


class Borrow:
    """A tensor lent to another stream; ``drop()`` gives it back (idempotent).

    Dropping it also ends the borrowed tensor and every view made from it on
    the borrowing stream (they share its storage); a borrow collected before
    ``drop()`` drops itself. A dropped borrow no longer holds the original
    tensor (``tensor`` is ``None``): as in Monarch, ``del t`` after the drop
    frees it.
    """

    def __init__(self, tensor: Any, view: Any, stream: Stream, mutable: bool) -> None:
        self.tensor: Any = tensor  # None once dropped
        self.stream = stream
        self.mutable = mutable
        self.dropped = False
        self._view_ref = view._ref
        self._what = ""  # the original tensor's repr, kept for __repr__ once dropped
        # the borrowed tensor's storage on this stream (Stream.borrow made it)
        self._borrowed: Storage = view._storage

    def drop(self) -> None:
        """Give the tensor back to its stream. Does not block.

        The origin stream runs nothing further (on the workers) until the
        borrowing stream has run what was issued before the drop. A failure
        recorded on a mutable borrow's tensor passes to the original tensor.
        """
        if self.dropped:
            return
        self.dropped = True
        t = self.tensor
        t._storage.returned()
        engine, shape = t._engine, t._mesh._shape
        key = engine.new_id()
        engine.send(
            shape, BorrowDrop(key, self._view_ref, t._ref, self.mutable), stream=self.stream.name
        )
        engine.send(shape, Wait(key), stream=t._stream.name)
        # the borrowed tensor and its views end here (they share its storage)
        self._borrowed.access = ""
        self._borrowed.dropped = True
        self._what = repr(t)
        self.tensor = None

    def __enter__(self) -> Borrow:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.drop()

    def __del__(self) -> None:
        if not self.dropped:
            try:
                self.drop()
            except Exception:  # the mesh stopped or its worker died: nothing left to give back
                log.debug("dropping %r when it was collected failed", self, exc_info=True)

    def __repr__(self) -> str:
        state = "dropped" if self.dropped else "held"
        what = self._what if self.tensor is None else repr(self.tensor)
        return f"<Borrow of {what} by {self.stream!r}, {state}>"


def check_use(what: str, tensors: Any, mutated: Any = (), stream: Stream | None = None) -> None:
    """Monarch's stream rules for an op: its tensors are on the active stream and accessible.

    Raises ``ValueError`` naming the tensor and what to do (activate its
    stream, borrow it, drop the borrow first); not ``TypeError`` as Monarch,
    which torch's operators turn into "unsupported operand type(s)".
    """
    if stream is None:
        stream = get_active_stream()
    for t in tensors:
        if t._stream is not stream:
            raise ValueError(
                f"{what}: {t!r} is on {t._stream!r} but the active stream is {stream!r}. Use "
                f"`with stream.activate():` for its stream, or move it here with "
                f"`{stream.name}_stream.borrow(t)`"
            )
        access = t._storage.access
        if "r" not in access:
            if t._storage.dropped:
                raise ValueError(
                    f"{what}: {t!r} came from a borrow that was dropped and is no longer usable"
                )
            raise ValueError(
                f"{what}: {t!r} cannot be used because it is lent mutably to another stream; "
                "call borrow.drop() first"
            )
    for t in mutated:
        if "w" not in t._storage.access:
            raise ValueError(
                f"{what}: {t!r} would be written but it is read only because it is being "
                "borrowed (immutably); drop the borrow first, or borrow it mutably"
            )


_MAIN = Stream("main", _default=True)


class _Streams:
    """This process's stack of active streams (a part of its node)."""

    def __init__(self) -> None:
        self.stack: list[Stream] = [_MAIN]
        self.lock = threading.Lock()  # guards stack


def get_active_stream() -> Stream:
    """The stream new ops go to (``main`` unless another is active). Does not block."""
    node = this_node(start=False)
    return _MAIN if node is None else node.part(_Streams).stack[-1]


@contextlib.contextmanager
def _activate(stream: Stream) -> Iterator[None]:
    streams = this_node().part(_Streams)
    stack = streams.stack
    with streams.lock:
        stack.append(stream)
    try:
        yield
    finally:
        with streams.lock:  # the latest activation of it: activations nest
            del stack[len(stack) - 1 - stack[::-1].index(stream)]
