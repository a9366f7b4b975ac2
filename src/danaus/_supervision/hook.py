"""What the client does with a failure nobody handled: ``unhandled_fault_hook``.

The hook runs on a dedicated client thread (never the I/O thread), one
failure at a time. The default prints the report and ends the program with
exit code 1 after running the at-exit handlers (fail fast). Replace it by
assignment: ``danaus.actor.unhandled_fault_hook = my_hook``; a hook that
returns swallows the failure; a hook that raises ends the program like the
default, and is not called again.

The hook's queue and thread belong to the client's node (a `Faults`
part): ending the node ends its thread once it has handled what was already
queued, and the next node starts a thread of its own on its first failure.
Whether the program is exiting (`exit_program()`) is the process's, not
a node's: it ends the process, whatever node it has.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import queue
import signal
import sys
import threading
import traceback
from typing import Any

from .. import _config as config
from .._runtime import node as _node
from .._runtime.logs.process import LogControl
from .failure import MeshFailure

__all__ = [
    "FaultExit",
    "Faults",
    "default_unhandled_fault_hook",
    "exit_program",
    "exiting",
    "submit",
]

log = logging.getLogger("danaus.supervision")

# Per process, not per node: exit_program() ends the process (os._exit at the
# latest), so once it has begun no node of this process may run a hook again,
# including one a new node would start while the at-exit handlers run.
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
        if _wake_armed:  # wake a main thread blocked in a system call (time.sleep, a read)
            signal.pthread_kill(main.ident, _WAKE_SIGNAL)
        main.join(config.get("main_exit_grace"))
        if not main.is_alive():
            return  # the main thread unwound: the interpreter exits with code 1 by itself
    force_exit_code()


# A main thread blocked in a system call (time.sleep, a read, select) sees the
# SystemExit set above only when it runs Python code again. A signal with a Python
# handler makes it do so at once: the call returns EINTR, the handler runs, and the
# pending exception is raised in it. SIGURG is ignored by default and not used by
# Python programs; it is taken only when nothing else handles it.
_WAKE_SIGNAL = signal.SIGURG
_wake_armed = False


def _wake(signum: int, frame: Any) -> None:
    """Runs in the main thread: the pending SystemExit is raised as it runs."""


def arm_wake_signal() -> None:
    """Install the wake-up handler (main thread only; only where SIGURG has no handler)."""
    global _wake_armed
    if _wake_armed or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(_WAKE_SIGNAL) not in (signal.SIG_DFL, None):
            return  # the program handles SIGURG itself: leave it alone
        signal.signal(_WAKE_SIGNAL, _wake)
        signal.siginterrupt(_WAKE_SIGNAL, True)
    except (ValueError, OSError):  # not the main interpreter, or signals unavailable
        return
    _wake_armed = True


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
    node = _node.this_node(start=False)
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


class Faults:
    """The unhandled-fault hook's queue and thread on one node (``node.part(Faults)``).

    The thread starts on the first failure; `on_node_end()` ends it after the
    failures queued before the node ended.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[MeshFailure | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards thread and ended
        self.thread: threading.Thread | None = None
        self.ended = False

    def submit(self, failure: MeshFailure) -> None:
        with self._lock:
            if self.ended:
                log.debug("the node has ended; dropping %s", failure.report())
                return
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="danaus-faults", daemon=True)
                self.thread.start()
        self._queue.put(failure)

    def _run(self) -> None:
        while True:
            failure = self._queue.get()
            if failure is None:
                return  # the node ended
            if _exiting.is_set():
                continue
            hook = _current_hook()
            try:
                hook(failure)
            except BaseException:
                print(
                    "danaus: unhandled_fault_hook raised while handling a failure; exiting "
                    f"with code 1.\n{failure.report()}\n{traceback.format_exc()}",
                    file=sys.stderr,
                    flush=True,
                )
                exit_program(1)

    def on_node_end(self) -> None:
        """End the thread: after what is queued, quietly; waited for (bounded) unless the
        program is exiting or the node is ended from the hook itself."""
        with self._lock:
            self.ended = True
            thread = self.thread
        if thread is None:
            return
        self._queue.put(None)
        if thread is not threading.current_thread() and not _exiting.is_set():
            thread.join(config.get("shutdown_timeout"))


def submit(node: _node.Node, failure: MeshFailure) -> None:
    """Hand a failure that reached the client to ``node``'s hook thread (returns at once)."""
    if node.closed:  # the node ended while the failure was on its way
        log.debug("no node; dropping %s", failure.report())
        return
    node.part(Faults).submit(failure)
