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
import ctypes
import logging
import os
import queue
import sys
import threading
import traceback
from typing import Any

from .. import _config as config
from .._runtime import node as _node
from .._runtime.logs import LogControl
from .failure import MeshFailure

__all__ = ["FaultExit", "default_unhandled_fault_hook", "exit_program", "exiting", "submit"]

log = logging.getLogger("danaus.supervision")

_queue: queue.SimpleQueue[MeshFailure] = queue.SimpleQueue()
_thread: threading.Thread | None = None
_lock = threading.Lock()
_exiting = threading.Event()


class FaultExit(SystemExit):
    """Raised in the client's main thread to end the program after an unhandled failure."""

    def __init__(self) -> None:
        super().__init__(1)


def exit_program(code: int = 1) -> None:
    """End the program with exit code 1, at-exit handlers included (from any thread).

    The main thread gets ``SystemExit(1)`` at its next Python instruction (danaus's
    own blocking waits wake up for it), so it unwinds and the interpreter exits
    normally. If it has not done so within ``main_exit_grace`` seconds (a setting) (blocked
    in C code, or it caught the exception), the handlers run here and the
    process ends anyway.
    """
    _exiting.set()

    def force_exit_code() -> None:
        # Registered last, so it runs first at exit: run the other handlers, then
        # end with ``code`` whatever the main thread's exception left as status.
        atexit.unregister(force_exit_code)
        try:
            atexit._run_exitfuncs()
        finally:
            _flush()
            os._exit(code)

    atexit.register(force_exit_code)
    main = threading.main_thread()
    if main.is_alive() and threading.current_thread() is not main and main.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(main.ident), ctypes.py_object(FaultExit)
        )
        main.join(config.get("main_exit_grace"))
        if not main.is_alive():
            return  # the main thread unwound: the interpreter exits with code 1 by itself
    force_exit_code()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def exiting() -> bool:
    """True once an unhandled failure is ending the program."""
    return _exiting.is_set()


def default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """Print the failure's report and end the program with exit code 1."""
    node = _node.current()
    printer = node.part(LogControl).printer if node is not None else None
    if printer is not None:
        printer.drain(config.get("log_tail_grace"))  # procs' output, then the report
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
