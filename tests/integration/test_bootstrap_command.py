"""``spawn_procs(bootstrap_command=...)``: procs started by running a command (issue 28).

``BootstrapCommand`` and ``default_bootstrap_cmd()`` as Monarch's; each proc
runs the command (wrappers such as ``env`` or a shell script that ``exec``s
the rest included) and ends up as an ordinary danaus proc. A command that
cannot run fails with an error naming it, its exit status and its output.
How such procs are supervised when killed: ``tests/supervision/test_bootstrap_command.py``;
the command as a value and what is refused before anything starts:
``tests/unit/actor/test_bootstrap_command.py``.
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from danaus.actor import (
    Actor,
    BootstrapCommand,
    Point,
    SupervisionError,
    default_bootstrap_cmd,
    endpoint,
    this_host,
)
from danaus.testing import wait_until

from .conftest import REPLY_TIMEOUT


class Env(Actor):
    @endpoint
    def get(self, var: str) -> str | None:
        return os.environ.get(var)

    @endpoint
    def pids(self) -> tuple[int, int]:
        return os.getpid(), os.getppid()


@pytest.fixture
def spawned():  # type: ignore[no-untyped-def]
    """``spawn(**kw)``: procs of ``this_host()``, stopped at teardown."""
    meshes = []

    def spawn(**kw):  # type: ignore[no-untyped-def]
        pm = this_host().spawn_procs(**kw)
        meshes.append(pm)
        return pm

    yield spawn
    for pm in meshes:
        pm.stop().get(timeout=REPLY_TIMEOUT)


def _setenv(var: str, value: str) -> None:
    os.environ[var] = value


def _script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# -- the proc entry ----------------------------------------------------------------


def test_the_proc_entry_run_by_hand_says_what_it_is_for() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DANAUS_BOOT_FD"}
    env.update(default_bootstrap_cmd().env)
    out = subprocess.run(
        [sys.executable, "-m", "danaus._runtime.hosting.entry"],
        env=env,
        capture_output=True,
        text=True,
        timeout=REPLY_TIMEOUT,
    )
    assert out.returncode != 0
    assert "spawn_procs(bootstrap_command=...)" in out.stderr, out.stderr


# -- procs started by a command -------------------------------------------------------


def test_procs_started_by_default_bootstrap_cmd_serve_and_see_its_env(spawned) -> None:  # type: ignore[no-untyped-def]
    cmd = default_bootstrap_cmd().with_env({"DANAUS_TEST_MARK": "3"})
    pm = spawned(per_host={"gpus": 2}, bootstrap_command=cmd)
    assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
    mesh = pm.spawn("env", Env)
    assert list(mesh.get.call("DANAUS_TEST_MARK").get(timeout=REPLY_TIMEOUT).values()) == ["3"] * 2
    assert list(mesh.get.call("DANAUS_BOOT_FD").get(timeout=REPLY_TIMEOUT).values()) == [None] * 2
    # The command exec'd in the zygote's child: the proc is that child, as a forked one is.
    forked = spawned(per_host={"gpus": 1}).spawn("env", Env)
    assert forked.get.call_one("DANAUS_TEST_MARK").get(timeout=REPLY_TIMEOUT) is None
    parents = {ppid for _, ppid in mesh.pids.call().get(timeout=REPLY_TIMEOUT).values()}
    assert parents == {forked.pids.call_one().get(timeout=REPLY_TIMEOUT)[1]}


def test_a_command_wrapped_in_env_passes_its_variables(spawned) -> None:  # type: ignore[no-untyped-def]
    base = default_bootstrap_cmd()
    cmd = BootstrapCommand(
        "/usr/bin/env", None, ["DANAUS_TEST_FOO=bar", base.program, *base.args], base.env
    )
    mesh = spawned(per_host={"gpus": 1}, bootstrap_command=cmd).spawn("env", Env)
    assert mesh.get.call_one("DANAUS_TEST_FOO").get(timeout=REPLY_TIMEOUT) == "bar"


def test_a_shell_script_that_sets_variables_then_execs_the_proc(spawned, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    script = _script(
        tmp_path, "wrap.sh", '#!/bin/sh\nexport DANAUS_TEST_WRAPPER_PID=$$\nexec "$@"\n'
    )
    base = default_bootstrap_cmd()
    cmd = BootstrapCommand(script, None, [base.program, *base.args], base.env)
    mesh = spawned(per_host={"gpus": 1}, bootstrap_command=cmd).spawn("env", Env)
    pid, _ = mesh.pids.call_one().get(timeout=REPLY_TIMEOUT)
    assert mesh.get.call_one("DANAUS_TEST_WRAPPER_PID").get(timeout=REPLY_TIMEOUT) == str(pid)


def test_a_wrapper_that_keeps_the_boot_fd_reads_nothing_once_the_proc_is_up(  # type: ignore[no-untyped-def]
    spawned, tmp_path: Path
) -> None:
    """The boot record holds the job's secret: a wrapper that runs the proc as a child
    (rather than exec) still holds the file, which the proc empties once it has read it."""
    seen = tmp_path / "seen"
    script = _script(
        tmp_path,
        "keep.sh",
        "#!/bin/sh\n"
        '"$@" &\n'
        "child=$!\n"
        f'while [ -s "/proc/self/fd/$DANAUS_BOOT_FD" ]; do sleep 0.05; done\n'
        f'wc -c < "/proc/self/fd/$DANAUS_BOOT_FD" > {seen}.tmp && mv {seen}.tmp {seen}\n'
        'wait "$child"\n',
    )
    base = default_bootstrap_cmd()
    cmd = BootstrapCommand(script, None, [base.program, *base.args], base.env)
    mesh = spawned(per_host={"gpus": 1}, bootstrap_command=cmd).spawn("env", Env)
    assert mesh.get.call_one("DANAUS_BOOT_FD").get(timeout=REPLY_TIMEOUT) is None
    assert wait_until(seen.exists, REPLY_TIMEOUT), "the wrapper still reads the boot record"
    assert seen.read_text().strip() == "0"


def test_a_callable_gives_each_proc_its_own_command(spawned) -> None:  # type: ignore[no-untyped-def]
    seen: list[Point] = []

    def per_rank(point: Point) -> BootstrapCommand:
        seen.append(point)
        return default_bootstrap_cmd().with_env({"DANAUS_TEST_GPU": str(point["gpus"])})

    mesh = spawned(per_host={"gpus": 2}, bootstrap_command=per_rank).spawn("env", Env)
    assert [dict(p) for p in seen] == [{"gpus": 0}, {"gpus": 1}]
    got = mesh.get.call("DANAUS_TEST_GPU").get(timeout=REPLY_TIMEOUT)
    assert list(got.values()) == ["0", "1"]


def test_a_large_boot_record_reaches_a_proc_started_by_a_command(spawned) -> None:  # type: ignore[no-untyped-def]
    # The bootstrap function travels in the boot record: far larger than a pipe's buffer.
    setup = functools.partial(_setenv, "DANAUS_TEST_BIG", "x" * 300_000)
    pm = spawned(per_host={"gpus": 1}, bootstrap=setup, bootstrap_command=default_bootstrap_cmd())
    got = pm.spawn("env", Env).get.call_one("DANAUS_TEST_BIG").get(timeout=REPLY_TIMEOUT)
    assert got is not None and len(got) == 300_000


# -- commands that fail -----------------------------------------------------------


def test_a_command_that_exits_before_the_proc_is_up_fails_with_its_status_and_output(
    spawned,  # type: ignore[no-untyped-def]
) -> None:
    cmd = BootstrapCommand("sh", None, ["-c", "echo wrapper gave up >&2; exit 3"], {})
    pm = spawned(per_host={"gpus": 1}, bootstrap_command=cmd)
    with pytest.raises(SupervisionError) as info:
        pm.initialized.get(timeout=REPLY_TIMEOUT)
    message = str(info.value)
    assert "exited with code 3" in message, message
    assert "sh -c 'echo wrapper gave up >&2; exit 3'" in message, message
    assert "wrapper gave up" in message, message


def test_a_program_that_cannot_be_executed_fails_with_code_127_and_why(
    spawned,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    # Executable, so it passes the check on this host, but not a program exec can run.
    prog = _script(tmp_path, "not-a-program", "\x00\x01 not an executable format\n")
    pm = spawned(per_host={"gpus": 1}, bootstrap_command=BootstrapCommand(prog, None, [], {}))
    with pytest.raises(SupervisionError) as info:
        pm.initialized.get(timeout=REPLY_TIMEOUT)
    message = str(info.value)
    assert "exited with code 127" in message, message
    assert "cannot run its bootstrap command" in message and "Exec format error" in message, message


def test_with_python_executable_starts_procs_with_that_python(spawned, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    python = _script(
        tmp_path,
        "python-wrapper",
        f'#!/bin/sh\nexport DANAUS_TEST_WRAPPER_PID=$$\nexec {sys.executable} "$@"\n',
    )
    host = this_host().with_python_executable(python)
    pm = host.spawn_procs(per_host={"gpus": 1})
    try:
        mesh = pm.spawn("env", Env)
        pid, _ = mesh.pids.call_one().get(timeout=REPLY_TIMEOUT)
        assert mesh.get.call_one("DANAUS_TEST_WRAPPER_PID").get(timeout=REPLY_TIMEOUT) == str(pid)
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)
    # this_host() itself is unchanged: its procs are forked as before.
    plain = spawned(per_host={"gpus": 1}).spawn("env", Env)
    assert plain.get.call_one("DANAUS_TEST_WRAPPER_PID").get(timeout=REPLY_TIMEOUT) is None
