"""The host agent's side of logs: it captures every proc's stdout and stderr, writes
them to per-proc files and forwards them to the client, never blocking a proc.

Before the zygote forks a proc, the agent makes two FIFOs in the job's
private socket directory and opens their read ends; the new proc opens the
write ends as its file descriptors 1 and 2 (so C extensions and
subprocesses are captured too) and unlinks them. The agent reads whatever
arrives, at once, and:

    complete lines --> <log dir>/<proc>.log                    (always, in full)
                   --> the last lines, kept for a crash report (LOG_TAIL to the owner)
                   --> a queue for the client (LOG frames)     (unless streaming is off)

The queue is flow-controlled: at most ``log_forward_window`` bytes are sent
and not yet acknowledged (LOG_ACK, once the client printed them), at most
``log_forward_buffer`` bytes wait; lines beyond that are dropped and the
client is told how many (``Log.dropped``). Reading never waits for the
client, so a proc that prints faster than the client prints never blocks on
its pipe. Order is kept per proc and stream.

When a proc exits, the agent reads what is left in its pipes before it
reports the exit, so the last lines of a crashed proc reach its owner
(LOG_TAIL, then LOST on the same connection).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import select
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._wire.ids import ProcId
from ..._wire.protocol import Kind, Log, LogConfig, LogFlush, LogTail, Message
from ..messaging.runtime import STATUS_OK, Runtime
from . import dirs as logdir

if TYPE_CHECKING:
    from ..._transport.conn import Connection

__all__ = ["LogCapture"]

log = logging.getLogger("danaus.agent")

_F_SETPIPE_SZ = 1031  # Linux
STDOUT, STDERR = 1, 2


@dataclass(eq=False)
class _Proc:
    """One captured proc."""

    name: str
    label: str
    coords: str
    owner: ProcId
    fifos: tuple[str, str]
    fds: dict[int, int]  # stream -> read end
    file: int  # the log file (O_APPEND)
    path: str
    meta: dict[str, Any]
    stream: bool = True  # forward to the client
    file_bytes: int = 0
    partial: dict[int, bytes] = field(default_factory=lambda: {STDOUT: b"", STDERR: b""})
    recent: collections.deque[tuple[bytes, int]] = field(default_factory=collections.deque)
    recent_lines: int = 0
    exited: bool = False


class LogCapture:
    """Captures the output of the procs of one host agent (lives on its I/O loop)."""

    def __init__(self, rt: Runtime, client: ProcId | None, job: str | None) -> None:
        self.rt = rt
        self.client = client
        self.dir: str | None = None
        self.procs: dict[str, _Proc] = {}
        # (proc, stream) -> its queue of [seq, lines, dropped before them]
        self.queues: dict[tuple[_Proc, int], collections.deque[list[Any]]] = {}
        self.ready: collections.deque[tuple[_Proc, int]] = collections.deque()
        self.queued = 0  # bytes waiting in the queues
        self.inflight = 0  # bytes sent, not yet acknowledged
        self.seq = 0  # items ever queued
        self.barriers: list[tuple[int, Any, int]] = []  # (last item to send first, port, slot)
        self._pump_soon = False
        self._buf = bytearray(max(65536, config.get("log_pipe_size")))
        if job is not None:
            self.set_job(client, job)
        rt.register(Kind.LOG_ACK, self._on_ack)
        rt.register(Kind.LOG_CONFIG, self._on_config)
        rt.register(Kind.LOG_FLUSH, self._on_flush)

    def set_job(self, client: ProcId | None, job: str) -> None:
        """Forward to ``client`` and write files for job ``job`` from now on."""
        self.client = client
        self._clear()
        try:
            self.dir = logdir.job_dir(job)
        except OSError as e:  # no files, but output still reaches the client
            log.error("cannot create the job log directory: %s", e)
            self.dir = None
        if self.dir is not None:
            logdir.configure_danaus_logging(self.dir, to_stderr=False)

    # -- procs ---------------------------------------------------------------------------

    def open(self, proc: ProcId, owner: ProcId, boot: dict[str, Any]) -> dict[str, Any]:
        """Make the pipes of a proc about to be forked; returns what its boot needs."""
        name = proc.name
        fifos = (
            os.path.join(self.rt.job_dir, f"{name}.out"),
            os.path.join(self.rt.job_dir, f"{name}.err"),
        )
        fds: dict[int, int] = {}
        try:
            for stream, path in zip((STDOUT, STDERR), fifos, strict=True):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                os.mkfifo(path, 0o600)
                fds[stream] = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fds[stream], _F_SETPIPE_SZ, config.get("log_pipe_size"))
        except OSError as e:
            log.error("cannot capture the output of proc %s: %s", name, e)
            for fd in fds.values():
                os.close(fd)
            for path in fifos:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            return {}
        label = str(boot.get("name") or "anon")
        coords = str(boot.get("coords") or "")
        path = os.path.join(self.dir, name + ".log") if self.dir else os.devnull
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        meta = {
            "proc": name,
            "label": label,
            "coords": coords,
            "host": self.rt.host,
            "started": time.time(),
        }
        p = _Proc(name, label, coords, owner, fifos, fds, file, path, meta)
        self.procs[name] = p
        self._write_meta(p)
        for stream, fd in fds.items():
            self.rt.loop.add_reader(fd, self._on_readable, p, stream)
        extra: dict[str, Any] = {"log_fifos": fifos}
        if self.dir is not None:
            extra["log_dir"] = self.dir
        return extra

    def forked(self, name: str, pid: int) -> None:
        p = self.procs.get(name)
        if p is not None:
            p.meta["pid"] = pid
            self._write_meta(p)

    def exited(self, name: str, failed: bool) -> None:
        """Proc ``name`` exited: read what is left; if it ``failed``, send its owner the tail."""
        p = self.procs.get(name)
        if p is None:
            return
        p.exited = True
        for path in p.fifos:  # in case it died before opening them
            with contextlib.suppress(OSError):
                os.unlink(path)
        for stream in list(p.fds):
            self._drain(p, stream)
        for stream in (STDOUT, STDERR):
            self._end_partial(p, stream)
        if failed:
            self.rt.send(p.owner, LogTail(name, self.tail(p)), on_fail=_ignore)
        if not p.fds:
            self._forget(p)

    def tail(self, p: _Proc) -> tuple[str, ...]:
        n = config.get("log_tail_lines")
        lines: list[bytes] = []
        for chunk, _ in reversed(p.recent):
            lines[:0] = chunk.rstrip(b"\n").split(b"\n")
            if len(lines) >= n:
                break
        return tuple(line.decode("utf-8", "replace") for line in lines[-n:]) if n > 0 else ()

    def _write_meta(self, p: _Proc) -> None:
        if self.dir is not None:
            try:
                logdir.write_meta(self.dir, p.name, p.meta)
            except OSError as e:
                log.error("cannot write the log description of proc %s: %s", p.name, e)

    def _forget(self, p: _Proc) -> None:
        if p.fds or self.procs.get(p.name) is not p:
            return
        del self.procs[p.name]
        os.close(p.file)

    # -- reading ---------------------------------------------------------------------------

    def _on_readable(self, p: _Proc, stream: int) -> None:
        self._drain(p, stream, budget=16)

    def _drain(self, p: _Proc, stream: int, budget: int = 64) -> None:
        """Read what the pipe holds (up to ``budget`` reads: then let others run)."""
        fd = p.fds.get(stream)
        buf = self._buf
        while fd is not None and budget > 0:
            budget -= 1
            try:
                n = os.readv(fd, [buf])
            except BlockingIOError:
                return
            except OSError:
                n = 0
            if n == 0:
                self._eof(p, stream)
                return
            self._take(p, stream, bytes(memoryview(buf)[:n]))
            if n < len(buf):
                return

    def _eof(self, p: _Proc, stream: int) -> None:
        fd = p.fds.pop(stream)
        self.rt.loop.remove_reader(fd)
        os.close(fd)
        self._end_partial(p, stream)
        if p.exited and not p.fds:
            self._forget(p)

    def _take(self, p: _Proc, stream: int, data: bytes) -> None:
        i = data.rfind(b"\n")
        if i < 0:
            partial = p.partial[stream] + data
            if len(partial) >= config.get("log_max_line"):
                p.partial[stream] = b""
                self._emit(p, stream, partial + b"\n")
            else:
                p.partial[stream] = partial
            return
        head = data[: i + 1]
        if p.partial[stream]:
            head = p.partial[stream] + head
        p.partial[stream] = data[i + 1 :]
        self._emit(p, stream, head)

    def _end_partial(self, p: _Proc, stream: int) -> None:
        """A line without its newline yet (a prompt, a progress bar) goes out as it is."""
        partial = p.partial[stream]
        if partial:
            p.partial[stream] = b""
            self._emit(p, stream, partial + b"\n")

    def _emit(self, p: _Proc, stream: int, chunk: bytes) -> None:
        """Complete lines ``chunk`` (ends with a newline) from ``stream`` of ``p``."""
        self._to_file(p, chunk)
        lines = chunk.count(b"\n")
        p.recent.append((chunk, lines))
        p.recent_lines += lines
        keep = config.get("log_tail_lines")
        while len(p.recent) > 1 and p.recent_lines - p.recent[0][1] >= keep:
            p.recent_lines -= p.recent.popleft()[1]
        if p.stream and self.client is not None:
            self._enqueue(p, stream, chunk, lines)

    def _to_file(self, p: _Proc, chunk: bytes) -> None:
        if p.path == os.devnull:
            return
        if p.file_bytes + len(chunk) > config.get("log_file_max") and p.file_bytes:
            try:
                os.replace(p.path, p.path + ".1")
                new = os.open(p.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            except OSError as e:
                log.error("cannot rotate the log file %s: %s", p.path, e)
            else:
                os.close(p.file)
                p.file = new
                p.file_bytes = 0
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(p.file, view) :]
        except OSError as e:  # a full disk must not stop the forwarding
            log.error("cannot write the log file %s: %s", p.path, e)
        p.file_bytes += len(chunk)

    # -- forwarding --------------------------------------------------------------------------
    #
    # Each (proc, stream) has its own queue of items [seq, data, dropped before it]; the
    # pump serves the queues in turn, one frame of up to ``log_frame_bytes`` each, so the
    # lines of one proc and stream stay in order and a chatty proc cannot starve the rest.
    # The pump runs once per loop iteration (whatever was read in it goes out together).

    def _enqueue(self, p: _Proc, stream: int, chunk: bytes, lines: int) -> None:
        key = (p, stream)
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = collections.deque()
        if not q:
            self.ready.append(key)
        self.seq += 1
        if self.queued + len(chunk) > config.get("log_forward_buffer"):
            if q and not q[-1][1]:
                q[-1][2] += lines  # more dropped after the last report
            else:
                q.append([self.seq, b"", lines])
        else:
            q.append([self.seq, chunk, 0])
            self.queued += len(chunk)
        if not self._pump_soon:
            self._pump_soon = True
            self.rt.loop.call_soon(self._pump)

    def _pump(self) -> None:
        self._pump_soon = False
        client = self.client
        if client is None:
            return
        window, most = config.get("log_forward_window"), config.get("log_frame_bytes")
        while self.ready and self.inflight < window:
            key = self.ready.popleft()
            p, stream = key
            q = self.queues[key]
            _, data, dropped = q.popleft()
            parts, size = [data], len(data)
            while q and not q[0][2] and size + len(q[0][1]) <= most:
                parts.append(q.popleft()[1])
                size += len(parts[-1])
            if q:
                self.ready.append(key)
            else:
                del self.queues[key]
            self.queued -= size
            self.inflight += size
            body = parts[0] if len(parts) == 1 else b"".join(parts)
            header = Log(p.name, p.label, p.coords, stream, dropped)
            self.rt.send(client, header, body, on_fail=self._client_gone)
        self._release_barriers()

    def _release_barriers(self) -> None:
        """Answer the flushes whose lines have all been sent."""
        if not self.barriers:
            return
        oldest = min((q[0][0] for q in self.queues.values() if q), default=self.seq + 1)
        while self.barriers and self.barriers[0][0] < oldest:
            _, port, slot = self.barriers.pop(0)
            self.rt.reply(port, slot, STATUS_OK, None)

    def client_gone(self) -> None:
        """The client is gone: forward nothing more (files are still written)."""
        self._client_gone("the client is gone")

    def _client_gone(self, reason: str) -> None:
        self.client = None
        self._clear()

    def _clear(self) -> None:
        self.queues.clear()
        self.ready.clear()
        self.queued = self.inflight = 0
        for _, port, slot in self.barriers:
            self.rt.reply(port, slot, STATUS_OK, None)
        self.barriers.clear()

    # -- frames ----------------------------------------------------------------------------

    def _on_ack(self, conn: Connection, msg: Message) -> None:
        self.inflight = max(0, self.inflight - msg.header.nbytes)
        self._pump()

    def _on_config(self, conn: Connection, msg: Message) -> None:
        cfg: LogConfig = msg.header
        for name in cfg.procs:
            p = self.procs.get(name)
            if p is None:
                continue
            if cfg.stream >= 0:
                p.stream = bool(cfg.stream)
            if cfg.label and cfg.label != p.label:
                p.label = p.meta["label"] = cfg.label
                self._write_meta(p)

    def _on_flush(self, conn: Connection, msg: Message) -> None:
        req: LogFlush = msg.header
        for name in req.procs:
            p = self.procs.get(name)
            if p is None:
                continue
            for stream, fd in list(p.fds.items()):
                # Only a pipe with something to say: one whose proc has not opened it
                # yet reads as EOF too, and closing it would leave the proc blocked
                # at start-up, opening it (a flush right after spawn_procs did that).
                if _readable(fd):
                    self._drain(p, stream)
            for stream in (STDOUT, STDERR):
                self._end_partial(p, stream)
        if self.client is None:
            self.rt.reply(req.port, req.slot, STATUS_OK, None)
            return
        self.barriers.append((self.seq, req.port, req.slot))
        self._pump()


def _readable(fd: int) -> bool:
    """Data or a hang-up waits on ``fd`` (Linux reports no hang-up on a FIFO whose
    writer has not opened it yet)."""
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return bool(poll.poll(0))


def _ignore(reason: str) -> None:
    pass
