"""The client's side of logs: print forwarded lines with their prefix, or aggregate them.

LOG frames from host agents are handed (I/O thread) to one printer thread,
which, for each batch of lines of one proc and stream:

- prefixes every line with the proc's mesh and coordinates,
  ``[trainer {hosts=1,gpus=3}] loss 0.25``;
- with an aggregation window (``logging_option(aggregate_window_sec=3)``,
  the default), collects the lines of the window and then prints each group
  of lines that differ only in numbers (ranks, steps, timings, ...) once:
  ``[8 similar lines] [trainer {hosts=0,gpus=0}] step 12 loss 0.25``; a line
  without similar ones prints as it is;
- without a window (``None``), prints them at once;
- keeps the last ``log_tail_lines`` lines of each proc (`tail()`) and
  counts lines received and dropped (`statistics()`);
- acknowledges the bytes to their agent (LOG_ACK), which is what lets the
  agent send more: a client that prints slowly makes agents drop (and
  count) lines, never makes a proc wait.

Everything is printed to the *current* ``sys.stdout`` / ``sys.stderr``, in
order per proc and stream.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import queue
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._wire.protocol import Log, LogAck, Message
from ..messaging.runtime import Runtime
from .dirs import format_prefix

if TYPE_CHECKING:
    from ..._transport.conn import Connection
    from ..._wire.ids import ProcId

__all__ = ["DEFAULT_WINDOW", "LogStatistics", "Printer"]

#: Monarch's default aggregation window, in seconds.
DEFAULT_WINDOW = 3.0
_DIGITS = b"0123456789"
_STREAMS = {1: "stdout", 2: "stderr"}


@dataclass(frozen=True)
class LogStatistics:
    """Counts of one proc's forwarded output (or of all procs)."""

    lines: int  # lines received
    bytes: int  # bytes of those lines
    dropped: int  # lines the host agent dropped because the client did not keep up


class _Group:
    __slots__ = ("count", "example", "stream")

    def __init__(self, example: bytes, stream: int) -> None:
        self.count = 1
        self.example = example
        self.stream = stream


class _Proc:
    __slots__ = ("bytes", "dropped", "lines", "tail")

    def __init__(self, keep: int) -> None:
        self.lines = 0
        self.bytes = 0
        self.dropped = 0
        self.tail: deque[bytes] = deque(maxlen=max(keep, 0))


class Printer:
    """Prints what host agents forward to this client (one thread, started on first use)."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._q: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._windows: dict[str, float | None] = {}
        self._labels: dict[str, str] = {}  # procs spawned from here -> their mesh's name
        self._procs: dict[str, _Proc] = {}
        self._groups: dict[tuple[str, int, bytes], _Group] = {}
        self._deadline: float | None = None  # when the current aggregation window ends
        # Guards the per-proc tables (_windows, _labels, _procs) and starting _thread.
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._keep = config.get("log_tail_lines")

    # -- called from any thread -------------------------------------------------------

    def on_log(self, conn: Connection, msg: Message) -> None:
        """A LOG frame (I/O thread): queue it for the printer thread."""
        self._start()
        self._q.put(("log", conn.peer, msg.header, bytes(msg.body)))

    def set_window(self, procs: list[str], window: float | None) -> None:
        """Aggregate the lines of ``procs`` over ``window`` seconds (``None``: print at once)."""
        with self._lock:
            for name in procs:
                self._windows[name] = window

    def set_label(self, procs: list[str], label: str) -> None:
        """Prefix the lines of ``procs`` with ``label`` (overrides what their agent says)."""
        with self._lock:
            for name in procs:
                self._labels[name] = label

    def barrier(self, cf: concurrent.futures.Future[None]) -> None:
        """Print everything received so far (aggregates too), then complete ``cf``."""
        if self._thread is None:
            _resolve(cf)
            return
        self._q.put(("barrier", cf))

    def tail(self, proc: str, n: int | None = None) -> list[str]:
        with self._lock:
            p = self._procs.get(proc)
            lines = list(p.tail) if p is not None else []
        if n is not None:
            lines = lines[-n:] if n > 0 else []
        return [line.decode("utf-8", "replace") for line in lines]

    def procs(self) -> list[str]:
        with self._lock:
            return list(self._procs)

    def statistics(self, proc: str | None = None) -> LogStatistics:
        with self._lock:
            ps = list(self._procs.values()) if proc is None else [self._procs.get(proc)]
        ps2 = [p for p in ps if p is not None]
        return LogStatistics(
            sum(p.lines for p in ps2), sum(p.bytes for p in ps2), sum(p.dropped for p in ps2)
        )

    def drain(self, timeout: float | None = None) -> None:
        """Print what is pending, waiting up to ``timeout`` seconds (at exit, before a report)."""
        if self._thread is None:
            return
        cf: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._q.put(("barrier", cf))
        if timeout is None:
            timeout = config.get("log_flush_timeout")
        with contextlib.suppress(concurrent.futures.TimeoutError):
            cf.result(timeout)

    # -- the printer thread ---------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is not None:
                return
            t = threading.Thread(target=self._run, name="danaus-logs", daemon=True)
            t.start()
            self._thread = t
        atexit.register(self.drain)

    def _run(self) -> None:
        while True:
            timeout = None
            if self._deadline is not None:
                timeout = max(0.0, self._deadline - time.monotonic())
            try:
                item = self._q.get(timeout=timeout)
            except queue.Empty:
                item = None
            try:
                if item is not None and item[0] == "log":
                    self._on_log(*item[1:])
                elif item is not None:
                    self._print_groups()
                    _resolve(item[1])
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    self._print_groups()
            except Exception:  # printing must go on whatever one batch does
                traceback.print_exc()

    def _on_log(self, agent: ProcId | None, h: Log, body: bytes) -> None:
        lines = body.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()
        with self._lock:
            p = self._procs.get(h.proc)
            if p is None:
                p = self._procs[h.proc] = _Proc(self._keep)
            p.lines += len(lines)
            p.bytes += len(body)
            p.dropped += h.dropped
            p.tail.extend(lines[-self._keep :] if self._keep > 0 else ())
            window = self._windows.get(h.proc, DEFAULT_WINDOW)
            label = self._labels.get(h.proc, h.label)
        prefix = format_prefix(label, h.coords).encode() + b" "
        if h.dropped:
            note = (
                f"{prefix.decode()}[{h.dropped} lines of {_STREAMS.get(h.stream, 'output')} "
                "dropped: the client did not keep up; the log file on the host has them all]\n"
            )
            self._write(h.stream, note)
        if lines:
            if window is None or window <= 0:
                self._write(h.stream, _join(prefix, lines))
            else:
                self._aggregate(label, h.stream, prefix, body, lines, window)
        if body and agent is not None:
            self.rt.send(agent, LogAck(len(body)), on_fail=_ignore)

    def _aggregate(
        self,
        label: str,
        stream: int,
        prefix: bytes,
        body: bytes,
        lines: list[bytes],
        window: float,
    ) -> None:
        keys = body.translate(None, _DIGITS).split(b"\n")  # numbers masked, in C
        del keys[len(lines) :]
        groups = self._groups
        # Counted in C; only a key seen for the first time costs a lookup of its example.
        for key, n in collections.Counter(keys).items():
            g = groups.get((label, stream, key))
            if g is None:
                g = groups[(label, stream, key)] = _Group(prefix + lines[keys.index(key)], stream)
                g.count = n
            else:
                g.count += n
        if self._deadline is None:
            self._deadline = time.monotonic() + window

    def _print_groups(self) -> None:
        self._deadline = None
        groups, self._groups = self._groups, {}
        out: dict[int, list[bytes]] = {1: [], 2: []}
        for g in groups.values():
            if g.count == 1:
                out.setdefault(g.stream, []).append(g.example + b"\n")
            else:
                out.setdefault(g.stream, []).append(
                    b"[%d similar lines] %s\n" % (g.count, g.example)
                )
        for stream, chunks in out.items():
            if chunks:
                self._write(stream, b"".join(chunks).decode("utf-8", "replace"))

    @staticmethod
    def _write(stream: int, text: str | bytes) -> None:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        target = sys.stderr if stream == 2 else sys.stdout
        try:
            target.write(text)
            target.flush()
        except (OSError, ValueError):  # closed, or a broken pipe: nothing to print to
            pass


def _join(prefix: bytes, lines: list[bytes]) -> bytes:
    sep = b"\n" + prefix
    return prefix + sep.join(lines) + b"\n"


def _resolve(cf: concurrent.futures.Future[None]) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        cf.set_result(None)


def _ignore(reason: str) -> None:
    pass
