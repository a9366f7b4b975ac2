"""What the transport layer holds for a runtime: one owner for it.

A `Transport` holds the write batches of the runtime's connections
(``conn.Batching``: which connections hold frames for a batched write, and the
epoch that a thread starting to wait advances) and the in-process network
its ``inproc:NAME`` listeners are on (``inproc.Network``). The runtime makes
one and closes it when it closes; the runtimes of a simulated mesh, which
live in the process of the runtime that built them, share that one's.

Imports: ``_errors``, ``_wire``.
"""

from __future__ import annotations

from .conn import Batching
from .inproc import Network

__all__ = ["Transport"]


class Transport:
    """The transport state of one runtime (and of the runtimes that share it)."""

    def __init__(self) -> None:
        self.batching = Batching()
        self.inproc = Network()

    def close(self) -> None:
        """Release what it holds: the listeners, and the connections holding a batch."""
        self.inproc.close()
        self.batching.close()
