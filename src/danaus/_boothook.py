"""Where a starting node finds the bootstrap: the package registers it, the node asks.

The bootstrap (``danaus._bootstrap``) sits above every layer and installs them all on a
node; the node (``_runtime/node.py``) sits below them. So the package
(``danaus/__init__``), which Python runs before any module of it, registers how to load
the bootstrap here, and a node asks for it when it starts. The import graph then has no
edge from the runtime up to the bootstrap, and no cycle through it.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

__all__ = ["bootstrap", "register"]

# How to load the bootstrap: set once by ``danaus/__init__`` at import, before any node
# can start, and the same in every process; a list so that registering needs no global.
_load: list[Callable[[], ModuleType]] = []


def register(load: Callable[[], ModuleType]) -> None:
    """Say how to load the bootstrap (``danaus/__init__`` does, once)."""
    _load[:] = [load]


def bootstrap() -> ModuleType:
    """The bootstrap module (its ``install(node, boot)`` and ``PRELOAD``)."""
    if not _load:
        raise RuntimeError(
            "no bootstrap is registered: danaus/__init__ registers it on import, so this "
            "process loaded danaus's modules in a way that skipped the package"
        )
    return _load[0]()
