"""``Stream``, ``get_active_stream`` and borrows: Monarch's streams, run in order.

Monarch runs each stream's ops concurrently on a worker (a CUDA stream
each) and orders them with borrows. Here every worker runs all its
commands in the order the client issued them, whatever their stream, so a
program written for streams gets the same values with no overlap; the API
is kept so such programs run unchanged (see docs/tensor.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .tensor import Tensor

__all__ = ["Borrow", "Stream", "get_active_stream"]


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

    def borrow(self, t: Tensor, mutable: bool = False) -> tuple[Tensor, Borrow]:
        """Use ``t`` on this stream: returns ``(t on this stream, borrow)``. Does not block.

        Call ``borrow.drop()`` when done. Raises ``TypeError`` for a tensor
        that is not a mesh tensor.
        """
        if not isinstance(t, Tensor):
            raise TypeError(f"Stream.borrow needs a mesh tensor (danaus.Tensor), got {type(t)}")
        return t, Borrow(t, self, mutable)

    def __repr__(self) -> str:
        return f"<Stream {self.name!r}>"


class Borrow:
    """A tensor lent to another stream; ``drop()`` gives it back (idempotent)."""

    def __init__(self, tensor: Tensor, stream: Stream, mutable: bool) -> None:
        self.tensor = tensor
        self.stream = stream
        self.mutable = mutable
        self.dropped = False

    def drop(self) -> None:
        """Return the tensor to its stream. Does not block."""
        self.dropped = True

    def __repr__(self) -> str:
        state = "dropped" if self.dropped else "held"
        return f"<Borrow of {self.tensor!r} by {self.stream!r}, {state}>"


_MAIN = Stream("main", _default=True)
_stack: list[Stream] = [_MAIN]


def get_active_stream() -> Stream:
    """The stream new ops go to (``main`` unless another is active). Does not block."""
    return _stack[-1]


@contextlib.contextmanager
def _activate(stream: Stream) -> Iterator[None]:
    _stack.append(stream)
    try:
        yield
    finally:
        _stack.remove(stream)
