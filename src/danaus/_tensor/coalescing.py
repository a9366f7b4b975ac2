"""``coalescing()``: the tensor ops of a block go to the workers together, at its end.

When the outermost block opens, what was issued before it is sent; inside,
the engines' sender threads send nothing, and what the block issues stays
queued, in order, and leaves when that block ends (``Engine.flush``: one
message per run of ops on one mesh slice and stream, plus one for the
deletions of tensors dropped meanwhile). Nested blocks are part of the
outermost one. As in Monarch, fetching a value
(``fetch_shard``, ``inspect``, a remote function's ``call``) inside a block
raises ``NotImplementedError``: it would wait for ops the block still holds.
A block left by an exception still sends what it queued, so every tensor it
made can be fetched (Monarch drops that block's ops).
Like Monarch's, a block is process-wide: every thread's ops are held.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["active", "check_not_coalescing", "coalescing"]

_lock = threading.Lock()
_depth = 0


def active() -> bool:
    """Whether a ``coalescing()`` block is open."""
    return _depth > 0


def check_not_coalescing(what: str) -> None:
    """``NotImplementedError`` if a block is open: ``what`` would wait for held ops."""
    if _depth > 0:
        raise NotImplementedError(
            f"NYI: {what} during a coalescing block (its ops are sent when the block "
            "ends); fetch after the `with coalescing():` block"
        )


@contextmanager
def coalescing() -> Iterator[None]:
    """Hold the tensor ops issued in the block and send them together when it ends."""
    global _depth
    with _lock:
        _depth += 1
        outermost = _depth == 1
    if outermost:  # what came before the block leaves now: the block holds its own ops
        from .engine import flush_all  # the engine module imports this one

        flush_all()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            outermost = _depth == 0
        if outermost:
            from .engine import flush_all  # the engine module imports this one

            flush_all()
