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

import math
import os
import socket
import struct
from collections import deque
from dataclasses import dataclass

__all__ = [
    "MAX_STRETCH",
    "PHI_THRESHOLD",
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
        phi reaches ``PHI_THRESHOLD``, never below ``timeout`` nor above the stretch."""
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
