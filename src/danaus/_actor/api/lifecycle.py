"""Ending the client: ``shutdown_context()`` stops everything it started (also at exit)."""

from __future__ import annotations

import atexit
import logging
from typing import TYPE_CHECKING

from ... import _config as config
from ..._runtime.hosting import host
from ..._runtime.node import this_node
from ..core.cell import ActorCell
from ..core.future import Future
from .procs import spawned_meshes

if TYPE_CHECKING:
    from ..._runtime.messaging.runtime import Runtime

__all__ = ["shutdown_context"]

log = logging.getLogger("danaus.actor")


def shutdown_context() -> Future[None]:
    """Stop every proc mesh and actor this client started, then its host agent and runtime.

    The client session (its node) ends: its socket directory is removed, and
    the next use of danaus in this process (``this_host().spawn_procs(...)``)
    starts a new session. Meshes of the old session refuse new work, saying
    so. Idempotent until then; runs at interpreter exit too. The returned
    future is already complete. Inside an actor it does nothing: the client
    owns the session.
    """
    node = this_node(start=False)
    if node is None or not node.client:
        return Future._resolved(None, "shutdown")
    with node.lock:
        if node.closed or node.shutting_down:
            return Future._resolved(None, "shutdown")
        node.shutting_down = True
    meshes = spawned_meshes(node)
    futures = [pm.stop("the client shut down") for pm in meshes]
    timeout = config.get("shutdown_timeout")
    for pm, f in zip(meshes, futures, strict=True):
        try:
            f.get(timeout=timeout)
        except Exception as e:  # the host agent ends what is left of it
            log.warning(
                "shutdown_context(): %r did not stop cleanly within %g s (setting "
                "shutdown_timeout), so its processes are killed: %s: %s",
                pm,
                timeout,
                type(e).__name__,
                e,
            )
    _stop_local_actors(node.runtime)
    host.shutdown(node)
    return Future._resolved(None, "shutdown")


def _stop_local_actors(rt: Runtime) -> None:
    cells = [c for c in list(rt.router.mailboxes.values()) if isinstance(c, ActorCell)]
    done: list[ActorCell] = []
    for cell in cells:
        if cell.stopped:
            continue
        cell.stop(None, 0, "the client shut down")
        done.append(cell)
    for cell in done:
        cell.thread.join(config.get("shutdown_timeout"))


def _at_exit() -> None:
    try:
        shutdown_context()
    except Exception:  # pragma: no cover - never let shutdown break interpreter exit
        log.warning("danaus could not shut down cleanly at exit", exc_info=True)


atexit.register(_at_exit)
