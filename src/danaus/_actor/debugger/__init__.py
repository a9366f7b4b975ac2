"""The distributed debugger: ``breakpoint()`` in an endpoint, driven from ``danaus debug``.

``remote`` is the proc side (the pdb whose terminal is the client),
``controller`` the actor in the client that holds the paused sessions and
serves the ``danaus debug`` prompt, ``commands`` the prompt's syntax.
"""

from __future__ import annotations

from typing import Any

from ..._runtime.node import Node

__all__ = ["debug_controller", "install"]


def install(node: Node, boot: dict[str, Any]) -> None:
    """A proc init hook: route actors' ``breakpoint()`` to the client (spawned procs only)."""
    if not boot:
        return  # the client: imports nothing (pdb costs ~10 ms to import)
    from .remote import install as install_remote

    install_remote(node.runtime, boot)


def debug_controller() -> Any:
    """The client's debug controller, an actor mesh of one, spawned on first use (blocks).

    It holds the sessions of actors paused in ``breakpoint()`` and serves the
    ``danaus debug`` prompt; ``debug_controller().sessions.call_one().get()``
    lists them (actor, rank, coords, host, pid, file, line, function).
    """
    from ..api.controller import get_or_spawn_controller
    from .controller import DebugController
    from .remote import CONTROLLER_NAME

    return get_or_spawn_controller(CONTROLLER_NAME, DebugController).get()
