"""The proc side of the debugger: ``breakpoint()`` in an endpoint opens a pdb whose terminal
is the client's debug controller.

::

    actor thread (paused in pdb)              debug controller (client)
      breakpoint() -> sys.breakpointhook
      --start(SessionInfo)---------------->   registers the session, announces it
      pdb prints into a buffer; to read a line:
      --read(key, output, where)---------->   shows output to whoever is attached,
      <-------------------------- line ----   answers with the line they typed
      ... endpoint returns (or raises: post-mortem first)
      --end(key, output)------------------>   the session is gone

Only the actor's own thread stops: pdb traces that thread alone, the proc's
I/O thread keeps its connections (and heartbeats) alive, and the other actors
of the proc keep handling messages. Output is sent with the next read, so a
pdb command costs one round trip. Source files the proc does not have (code
pickled by value from the client's ``__main__`` on another host) are fetched
from the client for ``list`` and stack entries.
"""

from __future__ import annotations

import asyncio
import bdb
import linecache
import logging
import os
import pdb
import socket
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._runtime.node import Node
from ..api.controller import get_or_spawn_controller
from ..core.context import context
from ..core.frames import user_traceback
from .controller import DebugController
from .session import CONTROLLER_NAME, OutputRing, SessionInfo

if TYPE_CHECKING:
    from ..._runtime.messaging.runtime import Runtime
    from ..core.cell import ActorCell
    from ..core.future import Future

__all__ = ["ProcDebugger", "RemotePdb", "install"]

log = logging.getLogger("danaus.actor")


class _Output:
    """pdb's stdout: kept (bounded) until the next read carries it to the controller."""

    def __init__(self) -> None:
        self._ring = OutputRing()

    def write(self, s: str) -> int:
        self._ring.append(s)
        return len(s)

    def flush(self) -> None:
        pass

    def take(self) -> str:
        out = self._ring.since()
        self._ring.clear()
        return out


class _Input:
    """pdb's stdin: each line comes from the controller."""

    def __init__(self, session: RemotePdb) -> None:
        self._session = session

    def readline(self) -> str:
        return self._session.read_line()


def _block(fut: Future[Any]) -> Any:
    """Wait for an actor call from an actor thread, even one running an event loop:
    a paused actor is meant to block its thread."""
    return fut._wait(None)


class RemotePdb(pdb.Pdb):
    """A pdb whose terminal is the debug controller in the client."""

    def __init__(self, controller: Any, info: SessionInfo, task: Any) -> None:
        self._out = _Output()
        # danaus's own frames are never stepped into: stepping out of the endpoint
        # runs to its end instead of showing the actor's message loop.
        # pdb calls only readline() on stdin and write()/flush() on stdout
        super().__init__(
            stdin=_Input(self),  # type: ignore[arg-type]
            stdout=self._out,  # type: ignore[arg-type]
            nosigint=True,
            skip=["danaus._*"],
        )
        self.prompt = "(Pdb) "
        self.controller = controller
        self.info = info
        self.task = task  # the asyncio task whose endpoint owns the session (async actors)
        self._fetched: set[str] = set()
        self._ended = False
        try:
            _block(controller.start.call_one(info))
        except Exception as e:
            raise bdb.BdbQuit(f"the debug controller in the client is unreachable: {e}") from e

    # -- I/O with the controller -----------------------------------------------

    def _where(self) -> tuple[str, int, str]:
        f = getattr(self, "curframe", None)  # set by pdb once it shows a frame
        if f is None:
            return self.info.where
        return (f.f_code.co_filename, f.f_lineno, f.f_code.co_name)

    def read_line(self) -> str:
        try:
            line = _block(
                self.controller.read.call_one(self.info.key, self._out.take(), self._where())
            )
        except Exception as e:
            raise bdb.BdbQuit(f"lost the debug controller in the client: {e}") from e
        return str(line)

    def endpoint_done(self, cell: ActorCell, exc: BaseException | None) -> None:
        """After an endpoint of ``cell``: post-mortem on ``exc``, then end this session.

        The cell calls it while ``cell.debugging`` is this session; a session
        opened by another concurrent endpoint of an async actor is left to that
        endpoint.
        """
        if self.task is not None and self.task is not _current_task():
            return
        cell.debugging = None
        self.finish(exc, bool(config.get("debug_post_mortem")))

    def finish(self, exc: BaseException | None, post_mortem: bool) -> None:
        """The endpoint is done: post-mortem on ``exc`` if asked, then end the session."""
        if self._ended:
            return
        if (
            post_mortem
            and isinstance(exc, Exception)
            and not isinstance(exc, bdb.BdbQuit)
            and exc.__traceback__ is not None
        ):
            try:
                self.message(f"post-mortem: the endpoint raised {type(exc).__name__}: {exc}")
                self.reset()
                self.interaction(None, user_traceback(exc.__traceback__))
            except bdb.BdbQuit:
                pass
        self.clear_all_breaks()
        self.set_continue()  # no breakpoints left: stops tracing this thread
        sys.settrace(None)
        self._ended = True
        try:
            _block(self.controller.end.call_one(self.info.key, self._out.take()))
        except Exception:  # the client is gone: nothing is listening for this session any more
            log.debug("the end of debug session %s reached no one", self.info.key, exc_info=True)

    # -- pdb behaviour over a remote terminal ------------------------------------

    def do_clear(self, arg: str) -> bool | None:
        if not arg:  # pdb would ask "Clear all breaks?" through input(): not our terminal
            self.clear_all_breaks()
            self.message("Deleted all breakpoints")
            return None
        return super().do_clear(arg)

    do_cl = do_clear

    def print_stack_entry(self, frame_lineno: Any, prompt_prefix: str = pdb.line_prefix) -> None:
        self._ensure_source(frame_lineno[0].f_code.co_filename)
        super().print_stack_entry(frame_lineno, prompt_prefix)

    def do_list(self, arg: str) -> None:
        if self.curframe is not None:
            self._ensure_source(self.curframe.f_code.co_filename)
        super().do_list(arg)

    do_l = do_list

    def do_longlist(self, arg: str) -> None:
        if self.curframe is not None:
            self._ensure_source(self.curframe.f_code.co_filename)
        super().do_longlist(arg)

    do_ll = do_longlist

    def _ensure_source(self, filename: str) -> None:
        """Fetch a file this proc lacks (code pickled by value on another host) from the client."""
        if filename in self._fetched or linecache.getlines(filename):
            return
        self._fetched.add(filename)
        try:
            source = _block(self.controller.source.call_one(filename))
        except Exception:
            return
        if source:
            lines = source.splitlines(keepends=True)
            linecache.cache[filename] = (len(source), None, lines, filename)


def _current_task() -> Any:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


class ProcDebugger:
    """This proc's debugger: the installed ``sys.breakpointhook`` and the controller's address."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._controller: Any = None
        self._lock = threading.Lock()  # guards _controller, found on first use
        self._previous_hook = sys.breakpointhook
        self._previous_set_trace = pdb.set_trace

    def controller(self) -> Any:
        with self._lock:
            if self._controller is None:
                self._controller = _block(get_or_spawn_controller(CONTROLLER_NAME, DebugController))
            return self._controller

    def breakpointhook(self, *args: Any, **kwargs: Any) -> Any:
        """``breakpoint()``: pause this actor for the debug controller (else plain pdb)."""
        if os.environ.get("PYTHONBREAKPOINT") == "0":  # Python's own switch to disable it
            return None
        cell = _running_cell()
        if cell is None:
            return self._previous_hook(*args, **kwargs)
        self.set_trace(cell, sys._getframe(1))
        return None

    def pdb_set_trace(self, *, header: str | None = None) -> None:
        """``pdb.set_trace()``: the same as ``breakpoint()`` inside an actor."""
        cell = _running_cell()
        if cell is None:
            self._previous_set_trace(header=header)
            return
        self.set_trace(cell, sys._getframe(1), header)

    def set_trace(self, cell: ActorCell, frame: FrameType, header: str | None = None) -> None:
        session = cell.debugging
        if session is None:
            inst = cell.ctx_instance
            assert inst is not None
            info = SessionInfo(
                cell.mesh_id,
                inst.name,
                cell.rank,
                dict(inst.rank),
                socket.gethostname(),
                os.getpid(),
                self.rt.proc_id.name,
                (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name),
            )
            task = _current_task() if cell.mode == "async" else None
            try:
                controller = self.controller()
            except Exception as e:
                raise bdb.BdbQuit(
                    f"breakpoint() in actor {inst.name} rank {cell.rank} could not reach the "
                    f"debug controller in the client: {e}"
                ) from e
            session = RemotePdb(controller, info, task)
            cell.debugging = session
        if header is not None:
            session.message(header)
        session.set_trace(frame)


def _running_cell() -> ActorCell | None:
    """The actor whose endpoint (or ``__init__``) runs on this thread, if any."""
    cell: ActorCell | None = context().actor_instance._cell
    if cell is None or cell.thread is not threading.current_thread():
        return None
    return cell


def install(node: Node, boot: dict[str, Any]) -> None:
    """In a spawned proc, route ``breakpoint()`` and ``pdb.set_trace()`` of actors to the client.

    The client keeps Python's own hooks: actors on ``this_proc()`` run in the
    client process, whose terminal pdb uses directly.
    """
    if not boot:
        return
    debugger = ProcDebugger(node.runtime)
    sys.breakpointhook = debugger.breakpointhook
    pdb.set_trace = debugger.pdb_set_trace
