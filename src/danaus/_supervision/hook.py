"""What the client does with a failure nobody handled: ``unhandled_fault_hook``.

The hook runs on a dedicated client thread (never the I/O thread), one
failure at a time. The default prints the report and ends the program with
exit code 1 after running the at-exit handlers (fail fast). Replace it by
assignment: ``danaus.actor.unhandled_fault_hook = my_hook``; a hook that
returns swallows the failure; a hook that raises ends the program like the
default, and is not called again.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
import traceback
from typing import Any

from .failure import MeshFailure

__all__ = ["default_unhandled_fault_hook", "exit_program", "submit"]

log = logging.getLogger("danaus.supervision")

_queue: queue.SimpleQueue[MeshFailure] = queue.SimpleQueue()
_thread: threading.Thread | None = None
_lock = threading.Lock()
_exiting = threading.Event()


def exit_program(code: int) -> None:
    """Run the at-exit handlers, flush, and end the process with ``code`` (any thread)."""
    _exiting.set()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """Print the failure's report and end the program with exit code 1."""
    print(
        f"danaus: a failure reached the client and nobody handled it; exiting with code 1.\n"
        f"{failure.report()}",
        file=sys.stderr,
        flush=True,
    )
    exit_program(1)


def _current_hook() -> Any:
    facade = sys.modules.get("danaus.actor")
    hook = getattr(facade, "unhandled_fault_hook", None) if facade is not None else None
    return hook if hook is not None else default_unhandled_fault_hook


def _worker() -> None:
    while True:
        failure = _queue.get()
        if _exiting.is_set():
            continue
        hook = _current_hook()
        try:
            hook(failure)
        except BaseException:
            print(
                "danaus: unhandled_fault_hook raised while handling a failure; exiting with "
                f"code 1.\n{failure.report()}\n{traceback.format_exc()}",
                file=sys.stderr,
                flush=True,
            )
            exit_program(1)


def submit(failure: MeshFailure) -> None:
    """Hand a failure that reached the client to the hook (returns at once)."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_worker, name="danaus-faults", daemon=True)
            _thread.start()
    _queue.put(failure)
