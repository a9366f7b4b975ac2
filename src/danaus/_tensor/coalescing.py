"""``coalescing()``: the tensor ops of a block go to the workers together, at its end.

When the outermost block opens, what was issued before it is sent; inside,
the ops the block's thread issues are held, in order, in that thread's state
(``client.ThreadState``) and leave when that block ends (``Engine.send_held``:
one message per run of ops on one mesh slice and stream, plus one for the
deletions of tensors dropped meanwhile, which wait for every open block of
that engine). Nested blocks are part of the outermost one. As in Monarch,
fetching a value (``fetch_shard``, ``inspect``, a remote function's
``call``) inside a block raises ``NotImplementedError``: it would wait for
ops the block still holds. A block left by an exception still sends what it
queued, so every tensor it made can be fetched (Monarch drops that block's
ops).

A block is per thread: another thread's ops are sent as usual and its
fetches work. Threads torch runs work on for the block's thread (autograd's
backward on device threads) act for it, so their ops join the block.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from . import client
from .engine import flush_all

__all__ = ["active", "check_not_coalescing", "coalescing"]

log = logging.getLogger("danaus.tensor")


def active() -> bool:
    """Whether a ``coalescing()`` block is open on the calling thread."""
    state = client.state_if_started()
    return state is not None and state.coalescing()


def check_not_coalescing(what: str) -> None:
    """``NotImplementedError`` if a block is open on this thread: ``what`` would wait for
    ops it holds."""
    if active():
        raise NotImplementedError(
            f"NYI: {what} during a coalescing block (its ops are sent when the block "
            "ends); fetch after the `with coalescing():` block"
        )


@contextmanager
def coalescing() -> Iterator[None]:
    """Hold the tensor ops this thread issues in the block and send them together when it
    ends."""
    rec = client.state().here()  # kept: the block ends on this node's state, whatever happens
    rec.depth += 1
    try:
        if rec.depth == 1:  # what came before the block leaves now: the block holds its own ops
            flush_all()
        yield
    finally:
        rec.depth -= 1
        if rec.depth == 0:
            held, rec.held = rec.held, {}
            for engine, ops in held.items():
                try:
                    engine.send_held(ops)
                except Exception:  # its mesh is gone, say: its tensors' next use says so
                    log.exception("tensor engine: sending what a coalescing block held failed")
