"""Liveness: is a silent peer lost, or only slow? Judged, not timed.

A missed heartbeat window alone is a poor signal on a loaded machine: a
process starved of CPU (or of its own GIL) answers late but is fine, and
declaring it lost kills healthy work. So the runtime's heartbeat asks this
module, and the answer depends on what can be known about the peer:

* **A proc on this host** (a Unix-socket peer): the kernel says. The peer's
  pid comes from the socket itself (``SO_PEERCRED``, which the peer cannot
  forge); once it has been silent for ``heartbeat_timeout``, ``/proc`` tells
  whether it is gone, stopped (every thread in state ``T``: SIGSTOP, a
  debugger), or running. A running proc that uses CPU is slow, not lost, for
  as long as that lasts; one that neither answers nor uses any CPU for half
  a timeout more (deadlocked with no thread running) is lost.
* **A peer on another host** (TCP): nothing but its frames can be seen, so
  a phi-accrual detector (Hayashibara et al.; as Akka and Cassandra use)
  turns the gaps seen between its frames into a suspicion level. A peer whose
  frames came steadily is declared lost about ``heartbeat_timeout`` after its
  last one; one whose frames have come irregularly (a loaded host) is given
  more time in proportion to the spread it has shown, up to
  ``MAX_STRETCH`` times the timeout.

Everything here runs on the I/O thread, once per heartbeat tick, never per
frame: the frame path only stamps ``last_recv``, as before.
"""

from __future__ import annotations

import logging
import math
import os
import select
import socket
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._wire.frame import encode_frame
from ..._wire.protocol import Ping, wire

if TYPE_CHECKING:
    import asyncio

    from ..._transport.conn import Connection

__all__ = [
    "MAX_STRETCH",
    "PHI_THRESHOLD",
    "WARMUP",
    "Heartbeat",
    "LocalProbe",
    "PhiAccrual",
    "ProcView",
    "peer_pid",
    "view",
]

#: Suspicion at which a remote peer is declared lost (Akka's default: a chance of
#: about 1e-8 that a peer this silent is still fine, given what it has shown).
PHI_THRESHOLD = 8.0
#: A remote peer is never given more than this many heartbeat timeouts of silence.
MAX_STRETCH = 2.0
#: Gaps remembered per peer.
WINDOW = 200
#: Gaps a peer must have shown before its rhythm is trusted: until then (a proc just
#: started, which may hold its GIL for seconds while it imports torch, or a client
#: that just attached) it is given the longest silence, ``MAX_STRETCH`` timeouts.
WARMUP = 10


def _phi(silence: float, mean: float, std: float) -> float:
    """-log10 of the chance that a gap is longer than ``silence`` (normal law,
    the logistic approximation Akka uses; monotonic in ``silence``)."""
    y = (silence - mean) / std
    e = math.exp(-y * (1.5976 + 0.070566 * y * y)) if y > -30 else math.inf
    if silence > mean:
        return -math.log10(e / (1.0 + e)) if e > 0 else math.inf
    return -math.log10(1.0 - 1.0 / (1.0 + e)) if math.isfinite(e) else 0.0


def _z(threshold: float) -> float:
    """The normalised gap at which ``_phi`` reaches ``threshold`` (by bisection)."""
    lo, hi = 0.0, 40.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if _phi(mid, 0.0, 1.0) < threshold:
            lo = mid
        else:
            hi = mid
    return hi


_Z = _z(PHI_THRESHOLD)


class PhiAccrual:
    """The gaps between a remote peer's frames, and how suspicious a silence is.

    ``interval`` and ``timeout`` are the heartbeat settings. The spread floor
    is a quarter of the interval; the acceptable pause is chosen so that a
    peer whose gaps were exactly one interval crosses ``PHI_THRESHOLD`` at
    ``timeout``: for it this detector is the plain timeout, and the
    adaptation only ever adds time, for peers that have shown irregular gaps.
    """

    __slots__ = ("_gaps", "_seen", "_sq", "_sum")

    def __init__(self, first: float) -> None:
        self._gaps: deque[float] = deque()
        self._sum = 0.0
        self._sq = 0.0
        self._seen = first  # the last arrival already counted

    def observe(self, last_recv: float) -> None:
        """Count the gap that ended at ``last_recv`` (if anything came since last time)."""
        gap = last_recv - self._seen
        if gap <= 0:
            return
        self._seen = last_recv
        self._gaps.append(gap)
        self._sum += gap
        self._sq += gap * gap
        if len(self._gaps) > WINDOW:
            old = self._gaps.popleft()
            self._sum -= old
            self._sq -= old * old

    def _law(self, interval: float, timeout: float) -> tuple[float, float]:
        """The expected silence and its spread: the normal law phi is taken from."""
        floor = interval / 4
        pause = timeout - interval - _Z * floor  # steady gaps of one interval: timeout
        n = len(self._gaps)
        if n < 2:
            return interval + pause, floor
        mean = max(interval, self._sum / n)
        std = max(floor, math.sqrt(max(0.0, self._sq / n - (self._sum / n) ** 2)))
        return mean + pause, std

    def deadline(self, interval: float, timeout: float) -> float:
        """The silence (seconds since the last frame) at which the peer is lost: where
        phi reaches ``PHI_THRESHOLD``, never below ``timeout`` nor above the stretch; the
        stretch itself while fewer than ``WARMUP`` gaps were seen (nothing yet says
        that the peer is steady)."""
        if len(self._gaps) < WARMUP:
            return MAX_STRETCH * timeout
        mu, sigma = self._law(interval, timeout)
        return min(MAX_STRETCH * timeout, max(timeout, mu + _Z * sigma))

    def phi(self, silence: float, interval: float, timeout: float) -> float:
        """The suspicion level of ``silence``."""
        return _phi(silence, *self._law(interval, timeout))

    def statistics(self) -> tuple[int, float, float]:
        """``(gaps counted, mean gap, spread)``, for diagnostics and tests."""
        n = len(self._gaps)
        if not n:
            return 0, 0.0, 0.0
        mean = self._sum / n
        return n, mean, math.sqrt(max(0.0, self._sq / n - mean * mean))


def peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process at the other end of a Unix socket (``SO_PEERCRED``),
    or ``None`` where the kernel cannot say (not Linux, another pid namespace)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None or sock.family != getattr(socket, "AF_UNIX", None):
        return None
    try:
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, opt, 12))
    except OSError:
        return None
    return pid if pid > 0 else None


def pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists, as ``kill(pid, 0)`` tells: one of another user
    counts, and so does a zombie (see ``ProcView`` for what ``/proc`` says of it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class ProcView:
    """What the kernel says of a local process right now."""

    gone: bool  # no such process, or a zombie
    stopped: bool  # every thread stopped (SIGSTOP, ptrace)
    running: bool  # some thread runnable or on a CPU
    cpu_ns: int  # CPU time of all its threads so far


def view(pid: int, proc: str = "/proc") -> ProcView | None:
    """Read ``pid``'s threads from ``/proc``; ``None`` where there is no ``/proc``."""
    base = f"{proc}/{pid}"
    try:
        tids = os.listdir(f"{base}/task")
    except FileNotFoundError:
        return ProcView(True, False, False, 0) if os.path.isdir(proc) else None
    except OSError:
        return None
    states: list[str] = []
    cpu = 0
    for tid in tids:
        try:
            with open(f"{base}/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # a thread that just ended
        # "pid (comm) S ...": comm may hold spaces and parentheses; the state
        # follows the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        states.append(fields[0].decode())
        try:  # on-CPU nanoseconds; stat's utime and stime count 10 ms ticks
            with open(f"{base}/task/{tid}/schedstat", "rb") as f:
                cpu += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            cpu += (int(fields[11]) + int(fields[12])) * _NS_PER_TICK  # utime, stime
    if not states or all(s in "ZX" for s in states):
        return ProcView(True, False, False, cpu)
    live = [s for s in states if s not in "ZX"]
    return ProcView(
        gone=False,
        stopped=all(s in "Tt" for s in live),
        running=any(s == "R" for s in live),
        cpu_ns=cpu,
    )


try:
    _NS_PER_TICK = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
    _NS_PER_TICK = 10_000_000


class LocalProbe:
    """Judges a silent proc on this host from its kernel state (see the module doc).

    ``check(silence, timeout)`` returns ``None`` while the proc is to be
    waited for, else why it is lost.
    """

    __slots__ = ("_cpu", "_proc", "_since", "pid")

    def __init__(self, pid: int, proc: str = "/proc") -> None:
        self.pid = pid
        self._proc = proc
        self._cpu: int | None = None  # CPU time when its silence passed the timeout
        self._since = 0.0  # when that was (silence seconds)

    def check(self, silence: float, timeout: float) -> str | None:
        if silence <= timeout:
            self._cpu = None
            return None
        v = view(self.pid, self._proc)
        if v is None:
            return f"no heartbeat for {timeout:.1f} s: the process is frozen"
        if v.gone:
            return f"no heartbeat for {timeout:.1f} s: its process {self.pid} is gone"
        if v.stopped:
            return (
                f"no heartbeat for {timeout:.1f} s: the process is frozen "
                f"(pid {self.pid} is stopped: SIGSTOP or a debugger)"
            )
        if v.running or self._cpu is None or v.cpu_ns > self._cpu:
            # Running or using CPU: slow (a loaded host, a long stretch holding
            # the GIL), not lost. Judge again from here.
            self._cpu, self._since = v.cpu_ns, silence
            return None
        if silence - self._since >= timeout / 2:
            return (
                f"no heartbeat for {silence:.1f} s: the process is frozen "
                f"(pid {self.pid} neither answers nor runs: deadlocked?)"
            )
        return None


log = logging.getLogger("danaus.runtime")

_NO_PID = object()  # a Unix peer whose pid the kernel did not give: the plain timeout


def _unread(conn: Connection) -> bool:
    """True if bytes wait in ``conn``'s socket: the peer spoke, we did not listen (our
    loop was held up, e.g. by a long callback), so it is no silent peer."""
    try:
        return bool(select.select([conn.fd], [], [], 0)[0])
    except (OSError, ValueError):
        return False


class Heartbeat:
    """Pings quiet connections and drops those whose peer is judged lost (a part of
    the runtime, on its I/O thread).

    Unix connections too: a proc on this host that is stopped (SIGSTOP) or
    deadlocked answers nothing, and its socket never closes. Whether a silence
    means lost is for the judges above to say: the kernel's view of a proc on
    this host, a phi-accrual detector for one on another.

    ``connections()``: every open connection; ``me()``: this proc's name;
    ``closed()``: whether the runtime has closed (the heartbeat stops).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        connections: Callable[[], list[Connection]],
        me: Callable[[], str],
        closed: Callable[[], bool],
    ) -> None:
        self.loop = loop
        self._connections = connections
        self._me = me
        self._closed = closed
        self.judges: dict[Connection, Any] = {}  # the judge of each watched connection

    def start(self) -> None:
        self.loop.call_later(config.get("heartbeat_interval"), self.tick)

    def tick(self) -> None:
        """One round: judge every watched connection, ping the quiet ones; again later."""
        if self._closed():
            return
        now = self.loop.time()
        interval, timeout = config.get("heartbeat_interval"), config.get("heartbeat_timeout")
        ping = None
        me = self._me()
        judges = self.judges
        for conn in self._connections():
            if conn.closed or conn.tcp is None:  # tcp None: in-process, nothing to watch
                continue
            if conn.paused or (conn.peer is not None and conn.peer.name == me):
                judges.pop(conn, None)  # we stopped reading it, or it is us: our silence
            else:
                why = self.judge(conn, now - conn.last_recv, interval, timeout)
                if why is not None:
                    conn.fail_now(why)
                    continue
            if conn.authenticated and now - conn.last_send > interval:
                ping = ping or encode_frame(wire(Ping()))
                try:
                    conn.send(ping)
                except Exception:  # a closing connection: its silence is judged next time
                    who = conn.peer.name if conn.peer is not None else "a peer"
                    log.debug("a heartbeat to %s could not be sent", who, exc_info=True)
        for conn in [c for c in judges if c.closed]:
            del judges[conn]
        self.loop.call_later(interval, self.tick)

    def judge(
        self, conn: Connection, silence: float, interval: float, timeout: float
    ) -> str | None:
        """Why ``conn``'s peer, silent for ``silence`` s, is lost; ``None`` if it is not."""
        judge = self.judges.get(conn)
        if judge is None:
            if conn.tcp:
                judge = PhiAccrual(conn.last_recv)
            else:
                pid = peer_pid(conn.sock)
                judge = LocalProbe(pid) if pid is not None else _NO_PID
            self.judges[conn] = judge
        if isinstance(judge, PhiAccrual):
            judge.observe(conn.last_recv)
            if silence <= judge.deadline(interval, timeout) or _unread(conn):
                return None
            n, mean, spread = judge.statistics()
            return (
                f"no heartbeat for {silence:.1f} s: the host is unreachable (partitioned) "
                f"or frozen (its last {n} gaps: mean {mean:.2f} s, spread {spread:.2f} s)"
            )
        if silence <= timeout or _unread(conn):
            if isinstance(judge, LocalProbe):
                judge.check(0.0, timeout)  # heard from: a later silence is judged afresh
            return None
        if isinstance(judge, LocalProbe):
            return judge.check(silence, timeout)
        return f"no heartbeat for {timeout:.1f} s: the process is frozen (stopped, or stuck)"
