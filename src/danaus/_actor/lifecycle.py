"""Ending the client: ``shutdown_context()`` stops everything it started (also at exit)."""

from __future__ import annotations

import atexit
import threading
from typing import Any

from .. import _config as config
from .._runtime import host
from .._runtime import proc as _proc
from .cell import ActorCell
from .future import Future
from .procs import owned_proc_meshes

__all__ = ["shutdown_context"]

_done = False
_lock = threading.Lock()


def shutdown_context() -> Future[None]:
    """Stop every proc mesh and actor this client started, then its host agent.

    Idempotent; the client cannot start new meshes afterwards. Runs at
    interpreter exit too. The returned future is already complete.
    """
    global _done
    with _lock:
        if _done:
            return Future._resolved(None, "shutdown")
        _done = True
    rt = _proc.current()
    if rt is None or not rt.boot:
        host.mark_shut_down()  # from here on, spawning says why it cannot
    if rt is not None and not rt.boot:
        futures = [pm.stop("the client shut down") for pm in owned_proc_meshes()]
        for f in futures:
            try:
                f.get(timeout=config.get("shutdown_timeout"))
            except Exception:
                pass
        _stop_local_actors(rt)
        host.shutdown()
    return Future._resolved(None, "shutdown")


def _stop_local_actors(rt: Any) -> None:
    cells = [c for c in list(rt.mailboxes.values()) if isinstance(c, ActorCell)]
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
        pass


atexit.register(_at_exit)
