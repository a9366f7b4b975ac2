"""The write batches of one runtime's connections."""

from __future__ import annotations

from typing import Protocol


class Held(Protocol):
    """A connection's writer that may hold a batch (``WriteBatcher``)."""

    def flush_held(self) -> None: ...


class Batching:
    """The write batches of the connections of one runtime (``state.Transport``):
    which connections hold one, and the wait epoch that ends a burst.

    A connection made without one (a test's) gets one of its own.
    """

    __slots__ = ("epoch", "held")

    def __init__(self) -> None:
        self.held: set[Held] = set()  # holding a batch (set.add/discard are atomic)
        self.epoch = 0  # changes whenever a thread of this process starts waiting

    def flush_held(self) -> None:
        """A thread of this process is about to wait: write every held batch now (any thread).

        Cheap when nothing is held. Sends after this are not held until one more
        send on the same connection shows a burst.
        """
        self.epoch += 1
        if self.held:
            for writer in list(self.held):
                writer.flush_held()

    def close(self) -> None:
        """Forget every connection (their runtime closed them, flushing what they held)."""
        self.held.clear()
