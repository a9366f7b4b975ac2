"""Which actor meshes a supervisor restarts: failures of those go to it, not their owner.

A part of the node (``node.part(Supervised)``) maps a mesh id to the function
the supervisor watching it takes failures with. The monitor asks
`intercept()` before it tells an owner; only failures of supervised meshes
pay more than one dictionary lookup.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .._runtime.node import Node

__all__ = ["Supervised", "intercept"]

# on_failure(rank, reason, traceback, log_tail) -> handled
Handler = Callable[[int, str, str, Any], bool]


class Supervised:
    """The meshes this process's supervisors watch (a part of its node)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards handlers and supervisors
        self.handlers: dict[str, Handler] = {}
        self.supervisors: list[Any] = []  # every Supervisor made here, for the dashboard

    def watch(self, mesh_id: str, handler: Handler) -> None:
        with self.lock:
            self.handlers[mesh_id] = handler

    def forget(self, mesh_id: str) -> None:
        with self.lock:
            self.handlers.pop(mesh_id, None)

    def on_node_end(self) -> None:
        with self.lock:
            sups, self.supervisors = list(self.supervisors), []
            self.handlers.clear()
        for sup in sups:
            sup._end_quietly()


def intercept(
    node: Node, mesh_id: str, rank: int, reason: str, tb: str = "", tail: Any = ()
) -> bool:
    """Hand a failure of ``mesh_id[rank]`` (a mesh of ``node``'s) to its supervisor;
    False if none watches it."""
    handler = node.part(Supervised).handlers.get(mesh_id)
    return handler is not None and handler(rank, reason, tb, tail)
