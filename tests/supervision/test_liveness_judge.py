"""The liveness judge: a silent peer is lost, or only slow, by what can be known of it.

Real child processes stand in for peers on this host (their kernel state is
what the judge reads); the phi-accrual detector is fed gaps directly.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from danaus._runtime.messaging import liveness
from danaus._runtime.messaging.liveness import MAX_STRETCH, LocalProbe, PhiAccrual
from danaus.testing import freeze

pytestmark = pytest.mark.timeout(60)

INTERVAL, TIMEOUT = 0.5, 5.0


def _fed(gaps: list[float]) -> PhiAccrual:
    d = PhiAccrual(0.0)
    t = 0.0
    for g in gaps:
        t += g
        d.observe(t)
    return d


def test_a_peer_with_steady_gaps_is_given_exactly_the_timeout() -> None:
    d = _fed([INTERVAL] * 100)
    assert d.deadline(INTERVAL, TIMEOUT) == pytest.approx(TIMEOUT)
    assert d.phi(TIMEOUT, INTERVAL, TIMEOUT) == pytest.approx(liveness.PHI_THRESHOLD, rel=1e-3)
    assert d.phi(TIMEOUT / 2, INTERVAL, TIMEOUT) < 1.0


def test_a_peer_that_showed_irregular_gaps_is_given_more_time_but_bounded() -> None:
    steady = _fed([INTERVAL] * 100).deadline(INTERVAL, TIMEOUT)
    jittery = _fed([INTERVAL, 1.0] * 50).deadline(INTERVAL, TIMEOUT)
    assert steady < jittery < MAX_STRETCH * TIMEOUT
    wild = _fed([INTERVAL, 60.0] * 50).deadline(INTERVAL, TIMEOUT)
    assert wild == pytest.approx(MAX_STRETCH * TIMEOUT)


def test_a_peer_not_yet_heard_long_enough_to_know_its_rhythm_gets_the_longest_silence() -> None:
    """A proc just started (importing torch, it may hold its GIL for seconds) or a client
    just attached: too few gaps to say it is steady, so no shorter deadline than the
    stretch; once ``WARMUP`` gaps were seen, the steady peer gets the plain timeout."""
    for n in (0, 1, liveness.WARMUP - 1):
        assert _fed([INTERVAL] * n).deadline(INTERVAL, TIMEOUT) == MAX_STRETCH * TIMEOUT
    steady = _fed([INTERVAL] * liveness.WARMUP).deadline(INTERVAL, TIMEOUT)
    assert steady == pytest.approx(TIMEOUT)


def test_the_window_forgets_old_gaps() -> None:
    d = _fed([INTERVAL, 2.5] * 50 + [INTERVAL] * liveness.WINDOW)
    assert d.deadline(INTERVAL, TIMEOUT) == pytest.approx(TIMEOUT)


def test_an_arrival_not_newer_than_the_last_counts_no_gap() -> None:
    d = _fed([INTERVAL] * 5)
    n = d.statistics()[0]
    d.observe(0.1)  # older than the last arrival counted
    assert d.statistics()[0] == n


def test_the_kernel_names_the_pid_at_the_other_end_of_a_unix_socket() -> None:
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        assert liveness.peer_pid(a) == os.getpid()
    with socket.socket(socket.AF_INET) as tcp:
        assert liveness.peer_pid(tcp) is None


@pytest.fixture
def child() -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []

    def start(code: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert p.stdout is not None
        assert p.stdout.readline() == b"up\n"  # it runs its code from here on
        made.append(p)
        return p

    yield start
    for p in made:
        if p.poll() is None:
            p.kill()
        p.wait()
        p.stdout.close()  # type: ignore[union-attr]


SLEEPS = "import time; print('up', flush=True); time.sleep(600)"
SPINS = "print('up', flush=True)\nwhile True: pass"


def test_a_stopped_proc_is_lost_once_the_timeout_has_passed(child) -> None:
    p = child(SLEEPS)
    freeze(p.pid)
    probe = LocalProbe(p.pid)
    assert probe.check(TIMEOUT - 0.1, TIMEOUT) is None
    why = probe.check(TIMEOUT + 0.1, TIMEOUT)
    assert why is not None and "frozen" in why and "stopped" in why
    os.kill(p.pid, signal.SIGCONT)


def test_a_proc_that_runs_is_slow_not_lost_however_long_it_is_silent(child) -> None:
    p = child(SPINS)
    probe = LocalProbe(p.pid)
    for silence in (TIMEOUT + 0.5 * k for k in range(1, 40)):
        assert probe.check(silence, TIMEOUT) is None


def test_a_proc_that_neither_answers_nor_runs_is_lost_half_a_timeout_later(child) -> None:
    p = child(SLEEPS)
    while _running(p.pid):  # from printing "up" into its sleep
        os.sched_yield()
    probe = LocalProbe(p.pid)
    assert probe.check(TIMEOUT + 0.5, TIMEOUT) is None  # first look: its CPU time noted
    assert probe.check(TIMEOUT + 0.5 + TIMEOUT / 2 - 0.1, TIMEOUT) is None
    why = probe.check(TIMEOUT + 0.5 + TIMEOUT / 2, TIMEOUT)
    assert why is not None and "neither answers nor runs" in why


def test_hearing_from_a_proc_starts_its_judgement_afresh(child) -> None:
    p = child(SLEEPS)
    probe = LocalProbe(p.pid)
    assert probe.check(TIMEOUT + 0.5, TIMEOUT) is None
    assert probe.check(0.0, TIMEOUT) is None  # it spoke
    assert probe.check(TIMEOUT + 0.5 + TIMEOUT, TIMEOUT) is None  # first look again


def test_a_proc_that_exited_is_gone(child) -> None:
    p = child(SLEEPS)
    pid = p.pid
    p.kill()
    p.wait()
    why = LocalProbe(pid).check(TIMEOUT + 0.1, TIMEOUT)
    assert why is not None and "is gone" in why


def test_a_zombie_is_gone(child) -> None:
    p = child(SLEEPS)
    os.kill(p.pid, signal.SIGKILL)
    while not _gone(p.pid):  # not reaped: a zombie as soon as the kill lands
        os.sched_yield()
    why = LocalProbe(p.pid).check(TIMEOUT + 0.1, TIMEOUT)
    assert why is not None and "is gone" in why


def _gone(pid: int) -> bool:
    v = liveness.view(pid)
    return v is not None and v.gone


def _running(pid: int) -> bool:
    v = liveness.view(pid)
    return v is not None and v.running
