"""Issue 26, F1 and F4: a job state (``.danaus/job_state.json``) another user planted is
refused and runs nothing; job states and batch logs are their owner's only.

Two real users: uid 1002 (the attacker) plants files in a shared, sticky,
world-writable directory (as /tmp is); uid 1001 (the victim) runs
``LocalJob().state()``, ``danaus exec`` and ``danaus kill`` there, each in a forked
child that switched to that uid (``setresuid``, no groups). A planted pickle would
create a marker file when unpickled.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from danaus.job import LocalJob, ProcessJob, job_load, job_loads

ATTACKER, VICTIM = 1002, 1001


def as_user(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


class Planted:
    """Unpickling this runs ``touch MARKER``: what an attacker's job state would do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory like /tmp (mode 1777), outside root's private pytest directory."""
    d = Path(tempfile.mkdtemp(prefix="danaus-shared-"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def plant(uid: int, path: Path, data: bytes, dir_mode: str = "777") -> None:
    """Write ``data`` at ``path`` as ``uid`` (its directory made by that user, ``dir_mode``)."""
    script = 'umask 0; mkdir -p "$1"; chmod "$3" "$1"; cat > "$2"'
    subprocess.run(
        [*as_user(uid), "sh", "-c", script, "sh", str(path.parent), str(path), dir_mode],
        input=data,
        check=True,
        timeout=30,
    )
    assert path.stat().st_uid == uid


def _preload() -> None:
    """Import what the victim's code will, here: the child cannot read our files (the
    checkout or the interpreter may lie in a directory only root can enter)."""
    import danaus._cli.main
    import danaus._job.jobs
    import danaus._job.load
    import danaus.job  # noqa: F401
    from danaus._cli import debug, jobs, logs, observe  # noqa: F401  (main's subcommands)
    from danaus._job import commands, current, execute, shell  # noqa: F401


def run_as_victim(cwd: Path, code: str | None = None, cli: list[str] | None = None) -> Result:
    """Run ``code`` (Python) or the ``danaus`` command line ``cli`` in a forked child that
    became uid ``VICTIM`` for real (``setresuid``, no groups), in ``cwd``."""
    _preload()
    home = cwd / f"home-{VICTIM}"
    home.mkdir(exist_ok=True)
    os.chown(home, VICTIM, VICTIM)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: only os._exit leaves it
            rc = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115  (not pytest's capture)
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115  (the child exits)
                os.setgroups([])
                os.setresgid(VICTIM, VICTIM, VICTIM)
                os.setresuid(VICTIM, VICTIM, VICTIM)
                os.chdir(cwd)
                os.environ.update(HOME=str(home), TMPDIR=str(home))
                if cli is not None:
                    from danaus._cli.main import main

                    rc = main(cli)
                else:
                    exec(code, {})
                    rc = 0
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        try:
            _, status = os.waitpid(pid, 0)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # a test timeout while waiting: no stray child
        out.seek(0)
        err.seek(0)
        return Result(os.waitstatus_to_exitcode(status), out.read().decode(), err.read().decode())


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def test_a_job_state_another_user_planted_is_refused_and_runs_nothing(shared: Path) -> None:
    marker = shared / "marker"
    evil = pickle.dumps(Planted(str(marker)))
    # Where the victim's clients look by default (new and old names), and a named file.
    plant(ATTACKER, shared / ".danaus" / "job_state.json", evil)
    plant(ATTACKER, shared / ".danaus" / "job_state.pkl", evil)
    plant(ATTACKER, shared / "planted" / "state.json", evil)

    state = run_as_victim(shared, "from danaus.job import LocalJob; LocalJob().state()")
    assert state.returncode != 0
    assert "ValueError" in state.stderr and "job_state.json" in state.stderr
    assert f"belongs to uid {ATTACKER}" in state.stderr

    for argv in (
        ["exec", "--state", str(shared / "planted" / "state.json"), "--", "true"],
        ["kill", "--state", str(shared / "planted" / "state.json")],
        ["kill"],  # the default, .danaus/job_state.json
    ):
        out = run_as_victim(shared, cli=argv)
        assert out.returncode == 2, out.stderr
        assert f"danaus {argv[0]}: the job state file" in out.stderr
        assert f"belongs to uid {ATTACKER}" in out.stderr
    assert not marker.exists()  # no planted code ran as the victim
    assert (shared / "planted" / "state.json").exists()  # and kill removed nothing of theirs


def test_a_well_formed_job_state_of_another_user_is_refused_too(shared: Path) -> None:
    # JSON runs no code, but a job state chooses the workers the client trusts (and
    # unpickles replies from): only the user's own is read, even in a directory the
    # victim trusts (root's, mode 755) and in the right format.
    trusted = shared / "trusted"
    trusted.mkdir(mode=0o755)
    path = trusted / "state.json"
    path.write_bytes(LocalJob().dumps())
    os.chown(path, ATTACKER, ATTACKER)
    os.chmod(path, 0o644)  # theirs, readable by the victim
    load = f"from danaus.job import job_load; job_load({str(path)!r})"
    out = run_as_victim(shared, load)
    assert out.returncode != 0
    assert f"state.json' belongs to uid {ATTACKER}, not to this user (uid {VICTIM})" in out.stderr


def test_a_job_state_in_a_directory_others_can_write_is_refused(shared: Path) -> None:
    # Root's own file, but in the sticky shared directory: another user could have put it there.
    path = shared / "mine.json"
    LocalJob().dump(str(tempfile.mkdtemp(dir=shared) + "/x.json"))  # dump's own dir: fine
    path.write_bytes(LocalJob().dumps())
    os.chmod(path, 0o600)
    with pytest.raises(ValueError, match=r"which others can write.*chmod go-w"):
        job_load(str(path))
    with pytest.raises(ValueError, match="which others can write"):
        LocalJob().state(cached_path=str(path))
    with pytest.raises(ValueError, match="which others can write"):
        LocalJob().dump(str(path))  # nor written there


def test_a_pickled_job_state_is_refused_even_from_the_user_itself(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    path = tmp_path / ".danaus" / "job_state.json"
    path.parent.mkdir(mode=0o700)
    path.write_bytes(pickle.dumps(Planted(str(marker))))
    os.chmod(path, 0o600)
    with pytest.raises(ValueError, match=r"pickled by an older danaus.*danaus kill --state"):
        job_load(str(path))
    with pytest.raises(ValueError, match="pickled by an older danaus"):
        LocalJob().state(cached_path=str(path))
    with pytest.raises(ValueError, match="pickled by an older danaus"):
        job_loads(pickle.dumps(Planted(str(marker))))
    assert not marker.exists()


def test_a_job_state_others_can_read_or_a_link_to_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    LocalJob().dump(str(path))
    os.chmod(path, 0o640)
    with pytest.raises(ValueError, match=r"readable or writable by others.*chmod 600"):
        job_load(str(path))
    os.chmod(path, 0o600)
    link = tmp_path / "link.json"
    link.symlink_to(path)
    with pytest.raises(ValueError, match="is a symbolic link"):
        job_load(str(link))
    assert isinstance(job_load(str(path)), LocalJob)


def test_the_job_state_is_json_data_with_a_schema_version(tmp_path: Path) -> None:
    job = ProcessJob({"trainers": 2}, env={"A": "1"})
    doc = json.loads(job.dumps())
    assert doc["format"] == "danaus-job-state" and doc["version"] == 1
    assert doc["kind"] == "ProcessJob" and doc["job"]["sizes"] == {"trainers": 2}
    doc["job"]["sizes"] = {"trainers": "2"}
    with pytest.raises(ValueError, match=r"field 'sizes' must be an object of host counts"):
        job_loads(json.dumps(doc).encode())
    doc["kind"] = "os.system"
    with pytest.raises(ValueError, match=r"kind 'os\.system', a class this process has not"):
        job_loads(json.dumps(doc).encode())


def test_dump_makes_its_directory_700_and_the_file_600_whatever_the_umask(
    tmp_path: Path,
) -> None:
    old = os.umask(0o002)
    try:
        LocalJob().dump(str(tmp_path / ".danaus" / "job_state.json"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / ".danaus").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / ".danaus" / "job_state.json").stat().st_mode) == 0o600
    assert [p.name for p in (tmp_path / ".danaus").iterdir()] == ["job_state.json"]


def test_the_batch_clients_log_is_600_in_a_700_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "client.py").write_text("print('client ran')\n")
    old = os.umask(0o002)
    job = ProcessJob({"hosts": 1})
    try:
        job.apply(client_script="client.py")
    finally:
        os.umask(old)
    try:
        assert job.client_log is not None
        log = Path(job.client_log)
        assert log.parent == tmp_path / ".danaus"
        assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
    finally:
        job.kill()
