"""Logs in every danaus process: a proc's end of the capture, options, flushes, crash tails.

- In a new proc (before it runs anything): `redirect_output()` points file
  descriptors 1 and 2 at the pipes its host agent reads (``logagent``), and
  makes Python's and C's stdout line-buffered so lines leave at once.
- In a proc: Python ``logging`` records go to stderr through one handler on
  the root logger, at the level ``logging_option`` sets (LOG_CONFIG);
  danaus's own loggers write to ``danaus.log`` in the job's log directory.
- In the client: LOG frames go to the printer (``logclient``), and danaus's
  own diagnostics to ``danaus.log``, errors also to stderr.
- Everywhere: `LogControl` (``node.part(LogControl)``) sends options, runs flush
  barriers, and keeps the last lines of crashed procs (LOG_TAIL) for their
  ``MeshFailure``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..._wire.ids import PortId, ProcId
from ..._wire.protocol import Kind, LogConfig, LogFlush, Message
from .. import node as _node
from ..messaging.runtime import Runtime
from ..node import Node
from . import dirs as logdir
from .client import LogStatistics, Printer

if TYPE_CHECKING:
    from ..._transport.conn import Connection

__all__ = [
    "LogControl",
    "control",
    "flush",
    "install",
    "line_buffer_output",
    "redirect_output",
    "statistics",
    "tail",
    "tailed_procs",
]

log = logging.getLogger("danaus.runtime")

_TAILS_KEPT = 1024  # crash tails waiting for their MeshFailure (most recent kept)
_RECORD_FORMAT = "%(levelname)s %(name)s: %(message)s"


def redirect_output(boot: dict[str, Any]) -> None:
    """In a freshly forked proc: write stdout and stderr to the agent's pipes."""
    fifos = boot.get("log_fifos")
    if not fifos:
        return
    for fd, path in zip((1, 2), fifos, strict=True):
        w = os.open(path, os.O_WRONLY)  # the agent holds the read end: does not block
        os.dup2(w, fd)
        os.close(w)
        with contextlib.suppress(OSError):
            os.unlink(path)
    line_buffer_output()


def line_buffer_output() -> None:
    """Make Python's and C's stdout and stderr line-buffered, so lines leave at once
    (a proc whose bootstrap command ran it: its descriptors were redirected before)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        except Exception:  # not a text stream of the io module: it buffers as it does
            log.debug("%r cannot be made line-buffered", stream, exc_info=True)
    _line_buffer_c_stdout()


def _line_buffer_c_stdout() -> None:
    """``printf`` in a C extension: a line at a time, like a terminal (best effort)."""
    try:
        libc = ctypes.CDLL(None)  # this process's libc (find_library would run ldconfig)
        stdout = ctypes.c_void_p.in_dll(libc, "stdout")
        libc.setvbuf(stdout, None, 1, 0)  # _IOLBF
    except (OSError, ValueError, AttributeError):
        pass


class _FlushPort:
    """Counts the answers of one flush (one per host agent); a lost agent counts too."""

    def __init__(self, rt: Runtime, n: int, done: Callable[[], None]) -> None:
        self.rt = rt
        self.left = n
        self.done = done
        self.agents: list[str] = []
        self.port = rt.router.open_port(self)
        self._lock = threading.Lock()  # guards left, the answers still due

    def tick(self, *_: Any) -> None:
        with self._lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.rt.call_soon(self.rt.router.close_port, self.port.port)
            self.rt.call_soon(self.rt.peers.unwatch, self.agents, self.port.port)
            self.done()

    def deliver(self, frame: Message) -> None:
        self.tick()

    def peer_lost(self, proc: str, reason: str) -> None:
        if proc in self.agents:
            self.tick()


class LogControl:
    """The log state of one process, a part of its node (``node.part(LogControl)``),
    bound to the node's runtime by `install()`; thread-safe."""

    def __init__(self) -> None:
        self._rt: Runtime | None = None
        self.agents: dict[str, ProcId] = {}  # procs spawned from here -> their host agent
        self.tails: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self.printer: Any = None  # the client's logclient.Printer
        self._lock = threading.Lock()  # guards agents and tails

    @property
    def rt(self) -> Runtime:
        """The runtime whose logs these are (once `install()` has bound it)."""
        if self._rt is None:
            raise RuntimeError("the logs of this process are not set up")
        return self._rt

    def track(self, procs: Iterable[ProcId], agent: ProcId) -> None:
        """``procs`` run on host agent ``agent`` (for flushes)."""
        with self._lock:
            for p in procs:
                self.agents[p.name] = agent

    def tail(self, proc: str) -> tuple[str, ...]:
        """The last lines of proc ``proc`` if it crashed (once: taken by its MeshFailure)."""
        with self._lock:
            return self.tails.pop(proc, ())

    def last_lines(self, proc: str) -> tuple[str, ...]:
        """The last lines of proc ``proc`` if it crashed, leaving them for its MeshFailure."""
        with self._lock:
            return self.tails.get(proc, ())

    def _on_tail(self, conn: Connection, msg: Message) -> None:
        with self._lock:
            self.tails[msg.header.name] = tuple(msg.header.lines)
            while len(self.tails) > _TAILS_KEPT:
                self.tails.popitem(last=False)

    def set_options(
        self,
        procs: list[ProcId],
        *,
        stream: bool | None = None,
        window: float | None = None,
        level: int | None = None,
        label: str = "",
    ) -> None:
        """Send options to ``procs``: the agent's part (stream, label) straight to the
        host agent of each proc spawned from here, the level to the procs.

        Procs of whose agent we know nothing pass the agent's part on
        themselves. That path cannot order the option before their later
        output (the agent reads the output from a pipe, the option from a
        socket), so it is only the fallback; ``flush()`` after this call is a
        barrier behind the options sent straight to agents.
        """
        if self.printer is not None and stream is not None:
            self.printer.set_window([p.name for p in procs], window if stream else None)
        if self.printer is not None and label:
            self.printer.set_label([p.name for p in procs], label)
        s = -1 if stream is None else int(stream)
        lv = -1 if level is None else level
        by_agent = self._by_agent(procs)
        if s >= 0 or label:
            for agent, names in by_agent.values():
                self.rt.send(agent, LogConfig(tuple(names), s, -1, label), on_fail=_ignore)
        direct = {name for _, names in by_agent.values() for name in names}
        for p in procs:
            if p.name == self.rt.proc_id.name:  # this process's output is not captured
                continue
            if p.name in direct:
                if lv >= 0:
                    self.rt.send(p, LogConfig((p.name,), -1, lv, ""), on_fail=_ignore)
            else:
                self.rt.send(p, LogConfig((p.name,), s, lv, label), on_fail=_ignore)

    def _by_agent(self, procs: list[ProcId]) -> dict[str, tuple[ProcId, list[str]]]:
        """The names of ``procs`` by their host agent (those whose agent is known)."""
        by_agent: dict[str, tuple[ProcId, list[str]]] = {}
        with self._lock:
            for p in procs:
                agent = self.agents.get(p.name)
                if agent is not None:
                    by_agent.setdefault(agent.name, (agent, []))[1].append(p.name)
        return by_agent

    def flush(
        self, procs: list[ProcId], timeout: float | None = None
    ) -> concurrent.futures.Future[None]:
        """Completes once every line ``procs`` wrote so far is forwarded (and, in the
        client, printed), or after ``timeout`` seconds; never fails."""
        cf: concurrent.futures.Future[None] = concurrent.futures.Future()

        def done() -> None:
            if self.printer is not None:
                self.printer.barrier(cf)
            else:
                _resolve(cf)

        by_agent = self._by_agent(procs)
        if timeout is not None:
            timer = threading.Timer(timeout, _resolve, (cf,))
            timer.daemon = True
            timer.start()
            cf.add_done_callback(lambda _: timer.cancel())
        if not by_agent:
            done()
            return cf
        port = _FlushPort(self.rt, len(by_agent), done)
        port.agents = list(by_agent)

        def send() -> None:
            for i, (agent, names) in enumerate(by_agent.values()):
                if self.rt.peers.watch(agent, port.port.port) is not None:
                    port.tick()
                    continue
                header = LogFlush(tuple(names), PortId(self.rt.proc_id, port.port.port), i)
                self.rt.send(agent, header, on_fail=port.tick)

        self.rt.call_soon(send)
        return cf


def _resolve(cf: concurrent.futures.Future[None]) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        cf.set_result(None)


def _ignore(reason: str) -> None:
    pass


def control(node: Node) -> LogControl:
    """The `LogControl` of ``node`` (its runtime's logs)."""
    ctl = node.part(LogControl)
    if ctl._rt is None:
        raise RuntimeError(f"the logs of proc {node.runtime.proc_id.name} are not set up")
    return ctl


class _RecordHandler(logdir.CurrentStderrHandler):
    """The root logger's handler in a proc: records to (the current) stderr, captured."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter(_RECORD_FORMAT))


def _on_config_in_proc(rt: Runtime, conn: Connection, msg: Message) -> None:
    cfg: LogConfig = msg.header
    if cfg.level >= 0:
        logging.getLogger().setLevel(cfg.level)
    if cfg.stream >= 0 or cfg.label:
        agent = rt.boot.get("agent")
        if agent is not None:
            rt.send(
                agent, LogConfig((rt.proc_id.name,), cfg.stream, -1, cfg.label), on_fail=_ignore
            )


def install(node: Node, boot: dict[str, Any]) -> None:
    """Set up logs in a new proc (``boot``) or the client (empty ``boot``)."""
    rt = node.runtime
    ctl = node.part(LogControl)
    ctl._rt = rt
    rt.register(Kind.LOG_TAIL, ctl._on_tail)
    if boot:
        rt.register(Kind.LOG_CONFIG, lambda conn, msg: _on_config_in_proc(rt, conn, msg))
        if boot.get("log_dir"):
            logdir.configure_danaus_logging(boot["log_dir"], to_stderr=False)
        root = logging.getLogger()
        if not root.handlers:
            root.addHandler(_RecordHandler())
        root.setLevel(logging.INFO)
        return
    ctl.printer = Printer(rt)
    rt.register(Kind.LOG, ctl.printer.on_log)
    try:
        logdir.configure_danaus_logging(logdir.job_dir(rt.proc_id.name), to_stderr=True)
    except OSError as e:
        log.error("cannot create the job log directory: %s", e)


# -- the client's view of forwarded output (for the dashboard and tests) ------------------
# Each takes the node whose output it reads (None: no node, nothing received).


def _printer(node: _node.Node | None) -> Any:
    return node.part(LogControl).printer if node is not None else None


def tail(node: _node.Node | None, proc: str, n: int | None = None) -> list[str]:
    """The last lines (at most ``n``, at most ``log_tail_lines``) that proc ``proc``
    wrote and ``node`` (a client's) received, oldest first; ``[]`` outside the client."""
    printer = _printer(node)
    return printer.tail(proc, n) if printer is not None else []


def tailed_procs(node: _node.Node | None) -> list[str]:
    """The names of the procs whose output ``node`` (a client's) has received."""
    printer = _printer(node)
    return printer.procs() if printer is not None else []


def statistics(node: _node.Node | None, proc: str | None = None) -> Any:
    """``LogStatistics(lines, bytes, dropped)`` ``node`` received, of one proc or all."""
    printer = _printer(node)
    return printer.statistics(proc) if printer is not None else LogStatistics(0, 0, 0)


def flush(
    node: _node.Node | None, procs: list[ProcId], timeout: float | None = None
) -> concurrent.futures.Future[None]:
    """Completes once every line ``procs`` wrote so far has been printed by ``node``
    (or after ``timeout`` seconds); for procs spawned from that node."""
    ctl = node.part(LogControl) if node is not None else None
    if ctl is None or ctl._rt is None:
        cf: concurrent.futures.Future[None] = concurrent.futures.Future()
        cf.set_result(None)
        return cf
    return ctl.flush(procs, timeout)
