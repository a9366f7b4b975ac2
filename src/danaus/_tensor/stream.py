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
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from .messages import BorrowCreate, BorrowDrop, Signal, Wait

__all__ = ["Borrow", "Stream", "check_use", "get_active_stream"]


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
        from .tensor import Tensor, meta_like

        if not isinstance(t, Tensor):
            raise TypeError(f"Stream.borrow needs a mesh tensor (danaus.Tensor), got {type(t)}")
        if t._stream is self:
            raise ValueError(
                f"{t!r} is already on {self!r}: borrow it onto another stream, or use it as is"
            )
        if mutable and "w" not in t._access:
            raise ValueError(
                "Cannot borrow this tensor mutably because it (or a view) is already being "
                "borrowed, or is itself an immutable borrow; drop the other borrow first"
            )
        if "r" not in t._access:
            raise ValueError(
                f"Cannot borrow {t!r}: it is lent mutably to another stream (or was dropped)"
            )
        engine, shape = t._engine, t._mesh._shape
        view = Tensor(meta_like(t._meta), t._mesh, engine, t.device, stream=self)
        key = engine.new_id()
        engine.send(shape, Signal(key), stream=t._stream.name)
        engine.send(shape, BorrowCreate(key, view._ref, t._ref), stream=self.name)
        if mutable:
            t._access = ""
            view._access = "rw"
        else:
            t._access = view._access = "r"
        t._borrows += 1
        borrow = Borrow(t, view, self, mutable)
        view._borrow = borrow
        return view, borrow

    def __repr__(self) -> str:
        return f"<Stream {self.name!r}>"


class Borrow:
    """A tensor lent to another stream; ``drop()`` gives it back (idempotent).

    Dropping it also ends the borrowed view and every view made from it on the
    borrowing stream; a borrow collected before ``drop()`` drops itself.
    """

    def __init__(self, tensor: Any, view: Any, stream: Stream, mutable: bool) -> None:
        self.tensor = tensor
        self.stream = stream
        self.mutable = mutable
        self.dropped = False
        self._view = view
        self._aliases: weakref.WeakSet[Any] = weakref.WeakSet()

    def _alias(self, t: Any) -> None:
        """``t`` was made from the borrowed view (a view of it): it ends with the borrow."""
        t._borrow = self
        t._access = self._view._access
        self._aliases.add(t)

    def drop(self) -> None:
        """Give the tensor back to its stream. Does not block.

        The origin stream runs nothing further (on the workers) until the
        borrowing stream has run what was issued before the drop. A failure
        recorded on a mutable borrow's view passes to the original tensor.
        """
        if self.dropped:
            return
        self.dropped = True
        t, view = self.tensor, self._view
        for alias in (view, *self._aliases):
            alias._access = ""
            alias._dropped = True
        t._borrows -= 1
        if t._borrows == 0:
            t._access = "rw"
        engine, shape = t._engine, t._mesh._shape
        key = engine.new_id()
        engine.send(
            shape, BorrowDrop(key, view._ref, t._ref, self.mutable), stream=self.stream.name
        )
        engine.send(shape, Wait(key), stream=t._stream.name)

    def __enter__(self) -> Borrow:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.drop()

    def __del__(self) -> None:
        if not self.dropped:
            try:
                self.drop()
            except Exception:  # the mesh stopped or its worker died: nothing left to give back
                pass

    def __repr__(self) -> str:
        state = "dropped" if self.dropped else "held"
        return f"<Borrow of {self.tensor!r} by {self.stream!r}, {state}>"


def check_use(what: str, tensors: Any, mutated: Any = ()) -> None:
    """Monarch's stream rules for an op: its tensors are on the active stream and accessible.

    Raises ``ValueError`` naming the tensor and what to do (activate its
    stream, borrow it, drop the borrow first); not ``TypeError`` as Monarch,
    which torch's operators turn into "unsupported operand type(s)".
    """
    stream = get_active_stream()
    for t in tensors:
        if t._stream is not stream:
            raise ValueError(
                f"{what}: {t!r} is on {t._stream!r} but the active stream is {stream!r}. Use "
                f"`with stream.activate():` for its stream, or move it here with "
                f"`{stream.name}_stream.borrow(t)`"
            )
        if "r" not in t._access:
            if t._dropped:
                raise ValueError(
                    f"{what}: {t!r} came from a borrow that was dropped and is no longer usable"
                )
            raise ValueError(
                f"{what}: {t!r} cannot be used because it is lent mutably to another stream; "
                "call borrow.drop() first"
            )
    for t in mutated:
        if "w" not in t._access:
            raise ValueError(
                f"{what}: {t!r} would be written but it is read only because it is being "
                "borrowed (immutably); drop the borrow first, or borrow it mutably"
            )


_MAIN = Stream("main", _default=True)
_stack: list[Stream] = [_MAIN]
_lock = threading.Lock()


def get_active_stream() -> Stream:
    """The stream new ops go to (``main`` unless another is active). Does not block."""
    return _stack[-1]


@contextlib.contextmanager
def _activate(stream: Stream) -> Iterator[None]:
    with _lock:
        _stack.append(stream)
    try:
        yield
    finally:
        with _lock:  # the latest activation of it: activations nest
            del _stack[len(_stack) - 1 - _stack[::-1].index(stream)]
