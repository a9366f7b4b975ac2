"""Procs started by a bootstrap command are supervised as forked ones (issue 28).

Killed with SIGKILL, such a proc is reported at once, calls to its actors
fail, and its host agent reaps it; a wrapper that runs the proc as its child
(not by ``exec``) takes the proc with it when it dies, so nothing is orphaned.
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from danaus.actor import (
    Actor,
    BootstrapCommand,
    SupervisionError,
    default_bootstrap_cmd,
    endpoint,
    this_host,
)
from danaus.testing import FaultRecorder

from .conftest import TIMEOUT, wait_pids_gone


class Pids(Actor):
    @endpoint
    def pids(self) -> tuple[int, int]:
        return os.getpid(), os.getppid()

    @endpoint
    def ping(self, x: int) -> int:
        return x


def test_a_command_started_proc_killed_by_sigkill_is_reported_as_a_forked_one(
    faults: FaultRecorder,
) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=default_bootstrap_cmd())
    mesh = pm.spawn("victims", Pids)
    pid, _ = mesh.slice(gpus=1).pids.call_one().get(timeout=TIMEOUT)
    os.kill(pid, signal.SIGKILL)
    failures = faults.wait(1)
    assert "SIGKILL" in str(failures[0]), str(failures[0])
    with pytest.raises(SupervisionError, match="SIGKILL"):
        mesh.slice(gpus=1).ping.call_one(1).get(timeout=TIMEOUT)
    assert mesh.slice(gpus=0).ping.call_one(2).get(timeout=TIMEOUT) == 2
    others = [p for p, _ in mesh.slice(gpus=0).pids.call().get(timeout=TIMEOUT).values()]
    pm.stop().get(timeout=TIMEOUT)
    assert wait_pids_gone([pid, *others]) == []  # reaped, the killed one and the stopped one


def test_a_proc_whose_wrapper_did_not_exec_it_dies_with_the_wrapper(
    faults: FaultRecorder, tmp_path: Path
) -> None:
    # The wrapper runs the proc as a child and waits for it: the zygote's child is the
    # wrapper. Killing it must not leave the proc behind.
    script = tmp_path / "wrap.sh"
    script.write_text('#!/bin/sh\n"$@"\nstatus=$?\nexit $status\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    base = default_bootstrap_cmd()
    cmd = BootstrapCommand(str(script), None, [base.program, *base.args], base.env)
    pm = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=cmd)
    mesh = pm.spawn("wrapped", Pids)
    pid, wrapper = mesh.pids.call_one().get(timeout=TIMEOUT)
    assert b"wrap.sh" in Path(f"/proc/{wrapper}/cmdline").read_bytes()  # not the zygote
    os.kill(wrapper, signal.SIGKILL)
    failures = faults.wait(1)
    assert "SIGKILL" in str(failures[0]), str(failures[0])
    assert wait_pids_gone([pid, wrapper]) == []
    with pytest.raises(SupervisionError):
        mesh.ping.call_one(1).get(timeout=TIMEOUT)
    pm.stop().get(timeout=TIMEOUT)
