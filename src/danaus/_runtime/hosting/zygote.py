"""The zygote: a pre-imported, thread-free process that forks new procs on request.

The host agent forks its zygote before it starts any thread or event loop,
so the zygote can fork safely. Requests and reports are length-prefixed
pickles of the records below, on two pipes:

    agent -> zygote   Fork(name, boot)
    zygote -> agent   Forked(name, pid) | Exited(name, pid, status)

When the agent goes away (its request pipe reaches EOF) the zygote kills
every proc it forked and exits. Each forked proc also asks the kernel to
kill it if the zygote dies (``PR_SET_PDEATHSIG``), so nothing is orphaned.
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import select
import signal
import struct
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "Exited",
    "Fork",
    "Forked",
    "PipeWriter",
    "read_msg",
    "set_pdeathsig",
    "write_msg",
    "zygote_loop",
]

_LEN = struct.Struct("<I")
_PR_SET_PDEATHSIG = 1


# -- the messages on the pipes (pickled: both ends run this module) ----------------


@dataclass(slots=True, frozen=True)
class Fork:
    """Agent -> zygote: fork proc ``name``, which starts from ``boot``."""

    name: str
    boot: dict[str, Any]


@dataclass(slots=True, frozen=True)
class Forked:
    """Zygote -> agent: proc ``name`` was forked as ``pid``."""

    name: str
    pid: int


@dataclass(slots=True, frozen=True)
class Exited:
    """Zygote -> agent: proc ``name`` (``pid``) ended; ``status`` is its ``waitpid`` status."""

    name: str
    pid: int
    status: int


def write_msg(fd: int, msg: object) -> None:
    data = pickle.dumps(msg, protocol=5)
    data = _LEN.pack(len(data)) + data
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class PipeWriter:
    """Length-prefixed pickles written to a pipe from an event loop, never blocking it.

    The agent asks its zygote for procs through a pipe of 64 KiB; the zygote
    forks one at a time, so a request for many procs fills the pipe long
    before they are all forked. A blocking write there would hold the agent's
    I/O loop (no heartbeats, no other requests) until the zygote caught up:
    spawning 64 procs on a loaded host stalled it past the heartbeat timeout.
    What the pipe does not take is kept, in order, and written when it can be.
    ``on_broken`` is called once if the reader is gone.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, fd: int, on_broken: Callable[[], None]
    ) -> None:
        self.loop = loop
        self.fd = fd
        self.on_broken = on_broken
        self.pending = bytearray()
        self._watching = False
        os.set_blocking(fd, False)

    def send(self, msg: object) -> None:
        """Queue ``msg`` and write what the pipe takes now (the loop's thread)."""
        data = pickle.dumps(msg, protocol=5)
        self.pending += _LEN.pack(len(data))
        self.pending += data
        self._flush()

    def _flush(self) -> None:
        while self.pending:
            try:
                n = os.write(self.fd, self.pending)
            except (BlockingIOError, InterruptedError):
                if not self._watching:
                    self._watching = True
                    self.loop.add_writer(self.fd, self._flush)
                return
            except OSError:  # EPIPE: the zygote is gone
                self.pending.clear()
                self._stop_watching()
                self.on_broken()
                return
            del self.pending[:n]
        self._stop_watching()

    def _stop_watching(self) -> None:
        if self._watching:
            self._watching = False
            self.loop.remove_writer(self.fd)


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks = []
    while n:
        try:
            b = os.read(fd, n)
        except InterruptedError:  # pragma: no cover
            continue
        if not b:
            return None
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def read_msg(fd: int) -> Any:
    """One message, or ``None`` at EOF."""
    head = _read_exact(fd, _LEN.size)
    if head is None:
        return None
    data = _read_exact(fd, _LEN.unpack(head)[0])
    return None if data is None else pickle.loads(data)


def set_pdeathsig(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    # This process's own symbols (libc among them): find_library("c") would run
    # ldconfig in a subprocess, and this runs in every proc the zygote forks.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def zygote_loop(req_r: int, resp_w: int, child_main: Callable[[str, dict[str, Any]], int]) -> None:
    """Serve fork requests until the request pipe closes. In a child, raise SystemExit.

    An unexpected error in the zygote itself is printed before it exits (its agent
    then ends the host's procs, saying the zygote died)."""
    try:
        _serve(req_r, resp_w, child_main)
    except SystemExit:
        raise  # a proc leaving (the child's path), or the zygote's own exit
    except BaseException:
        traceback.print_exc()
        print(f"danaus zygote {os.getpid()}: exiting after the error above", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)


def _serve(req_r: int, resp_w: int, child_main: Callable[[str, dict[str, Any]], int]) -> None:
    parent = os.getppid()
    set_pdeathsig()
    if os.getppid() != parent:  # pragma: no cover - the agent died while we started
        os._exit(1)
    # Everything the zygote holds now (the preloaded modules) goes to the collector's
    # permanent generation, which no collection walks: a proc's collections, and its
    # final one at exit, would otherwise write the header of every inherited object,
    # copying each page they share with the zygote (measured: a proc's CPU, start to
    # exit, ~85 ms without, ~37 ms with).
    gc.freeze()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    children: dict[int, str] = {}
    while True:
        try:
            ready, _, _ = select.select([req_r, wake_r], [], [])
        except InterruptedError:  # pragma: no cover
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(children, resp_w)
        if req_r not in ready:
            continue
        msg = read_msg(req_r)
        if msg is None:
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            os._exit(0)
        if type(msg) is not Fork:
            raise TypeError(f"the zygote was sent {msg!r:.200}, not a Fork")
        name, boot = msg.name, msg.boot
        pid = os.fork()
        if pid == 0:
            # The new proc: drop the zygote's fds and signal set-up, then run.
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (req_r, resp_w, wake_r, wake_w):
                os.close(fd)
            zygote_pid = os.getppid()
            set_pdeathsig()
            if os.getppid() != zygote_pid:  # pragma: no cover
                os._exit(1)
            raise SystemExit(child_main(name, boot))
        children[pid] = name
        write_msg(resp_w, Forked(name, pid))


def _reap(children: dict[int, str], resp_w: int) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        name = children.pop(pid, None)
        if name is not None:
            write_msg(resp_w, Exited(name, pid, status))
