"""Issue 40, N4, N7, N8 and the detached worker's log: files and directories danaus
makes cannot be redirected or taken over by another user of the host.

Another real uid (``nobody``, through ``setpriv``) plants what it can: symbolic
links where danaus writes a file, a ``/tmp/danaus-<uid>`` directory of its own
before the user's first job. Each attack worked on the code before issue 40.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import danaus
import danaus.config

NOBODY = pwd.getpwnam("nobody").pw_uid
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
TIMEOUT = 60.0


def as_nobody(*argv: str) -> None:
    subprocess.run([*AS_NOBODY, *argv], check=True, timeout=30, capture_output=True)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may write, without the sticky bit (a shared project
    folder, say): the kernel's protection of links in sticky directories does not
    apply, as it does not on many shared file systems."""
    d = Path(tempfile.mkdtemp(prefix="danaus-shared-"))
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def precious(tmp_path: Path) -> Path:
    victim = tmp_path / "precious.txt"
    victim.write_text("precious")
    return victim


# -- N4: danaus.trace(path) ---------------------------------------------------------


def test_a_trace_never_writes_through_a_link_another_user_planted(
    shared: Path, precious: Path
) -> None:
    path = shared / "trace.json"
    # The temporary name the old code used (predictable: the pid), linked to the victim.
    as_nobody("ln", "-s", str(precious), str(shared / f"trace.json.tmp{os.getpid()}"))
    with danaus.trace(path):
        pass
    assert precious.read_text() == "precious"
    assert "traceEvents" in json.loads(path.read_text())
    assert [p.name for p in shared.iterdir() if p.name.endswith(".tmp")] == []


# -- N7: private directories, parents included -------------------------------------


def test_private_directories_and_their_parents_are_700_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from danaus._job.servers import home
    from danaus._runtime.logs import dirs

    root = tmp_path / "a" / "b" / ".danaus"
    logs = tmp_path / "logs-parent" / "logs"
    monkeypatch.setenv("DANAUS_HOME", str(root))
    old = os.umask(0o002)
    try:
        with danaus.config.configured(log_dir=str(logs)):
            made = [home("sub", "deeper"), Path(dirs.job_dir("j1"))]
    finally:
        os.umask(old)
    for path in [tmp_path / "a", tmp_path / "a" / "b", root, *made, logs.parent, logs]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


def test_an_existing_private_directory_is_made_private_or_refused_if_not_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from danaus._job.servers import home

    mine = tmp_path / "mine"
    mine.mkdir(mode=0o775)  # as the old code left ~/.danaus under umask 002
    os.chmod(mine, 0o775)
    monkeypatch.setenv("DANAUS_HOME", str(mine))
    assert home() == mine and stat.S_IMODE(mine.stat().st_mode) == 0o700
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, NOBODY, NOBODY)
    monkeypatch.setenv("DANAUS_HOME", str(theirs))
    with pytest.raises(ValueError, match=f"belongs to uid {NOBODY}"):
        home()
    link = tmp_path / "link"
    link.symlink_to(mine)
    monkeypatch.setenv("DANAUS_HOME", str(link))
    with pytest.raises(ValueError, match="not a directory"):
        home()


# -- N8: /tmp/danaus-<uid> planted by another user -----------------------------------

_SPAWN = """
import os
from danaus._runtime.node import this_node
from danaus._runtime.logs.dirs import base_dir
from danaus.actor import Actor, endpoint, this_host

class Where(Actor):
    @endpoint
    def where(self):
        from danaus._runtime.node import this_node
        return this_node().runtime.job_dir

procs = this_host().spawn_procs(per_host={"gpus": 1})
print("proc", procs.spawn("where", Where).where.call_one().get(timeout=60))
print("client", this_node().runtime.job_dir)
print("logs", base_dir())
procs.stop().get(timeout=60)
"""


@pytest.mark.parametrize("xdg", [False, True], ids=["fresh", "xdg-runtime-dir"])
def test_a_socket_directory_another_user_made_first_is_never_used(
    shared: Path, tmp_path: Path, xdg: bool
) -> None:
    from danaus.testing import ClientScript, client_env

    os.chmod(shared, 0o1777)  # as /tmp
    planted = shared / f"danaus-{os.getuid()}"
    as_nobody("sh", "-c", f"umask 0; mkdir {planted}")
    env = {
        k: v for k, v in client_env().items() if k not in ("DANAUS_SOCKET_DIR", "XDG_RUNTIME_DIR")
    }
    env.update(TMPDIR=str(shared), DANAUS_LOG_DIR="")
    if xdg:
        runtime = tmp_path / "run"
        runtime.mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(runtime)
    script = ClientScript(tmp_path).write(_SPAWN)
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=90
    )
    assert out.returncode == 0, out.stderr
    where = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    base = Path(where["client"]).parent
    assert base != planted and not base.is_relative_to(planted)
    if xdg:
        assert base == runtime / "danaus"
    else:
        assert base.parent == shared and base.name.startswith(f"danaus-{os.getuid()}-")
    assert Path(where["proc"]).parent == base  # the agent and its procs use it too
    assert Path(where["logs"]) == base / "logs"
    assert stat.S_IMODE(base.stat().st_mode) == 0o700 and base.stat().st_uid == os.getuid()
    assert list(planted.iterdir()) == []  # nothing went into the planted one
    warnings = [line for line in out.stderr.splitlines() if f"not using {planted}" in line]
    assert len(warnings) == 1, out.stderr
    assert f"belongs to uid {NOBODY}" in warnings[0]
    shutil.rmtree(base, ignore_errors=True)


# -- Also: the detached worker's log, OTel headers ---------------------------------


def test_a_detached_worker_never_writes_its_log_through_a_planted_link(
    shared: Path, precious: Path
) -> None:
    log = shared / "worker.log"
    as_nobody("ln", "-s", str(precious), str(log))
    env = {**os.environ, "DANAUS_SECRET": "s" * 64}
    argv = [sys.executable, "-m", "danaus", "worker", "--detach", "--log-file", str(log)]
    out = subprocess.run(
        [*argv, "--listen", "tcp://127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    started = [w for w in out.stdout.split() if w.isdigit()]
    with contextlib.suppress(ProcessLookupError, ValueError):  # the old code started one
        os.killpg(int(started[0]), 9) if started else None
    assert out.returncode == 2 and "is a symbolic link" in out.stderr, (out.stdout, out.stderr)
    assert precious.read_text() == "precious"


def test_otel_header_variables_travel_in_no_spawn_frame(tmp_path: Path) -> None:
    from danaus.testing import ClientScript, client_env

    script = ClientScript(tmp_path).write(
        """
        import os
        from danaus._runtime.node import this_node
        from danaus._wire.frame import encode_frame
        from danaus._wire.protocol import SpawnProcs, wire
        from danaus.actor import Actor, endpoint, this_host

        class Peek(Actor):
            @endpoint
            def env(self):
                return os.environ.get("OTEL_SERVICE_NAME"), os.environ.get("DANAUS_TELEMETRY")

        rt = this_node().runtime
        sent = []
        plain = rt.send

        def spy(proc, header, body=b"", buffers=(), on_fail=None, **kw):
            raw = encode_frame(wire(header), body, buffers)
            sent.append((type(header), b"".join(map(bytes, raw))))
            return plain(proc, header, body, buffers, on_fail, **kw)

        rt.send = spy
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        print("env", procs.spawn("peek", Peek).env.call_one().get(timeout=60))
        rt.send = plain
        spawns = [f for kind, f in sent if kind is SpawnProcs]
        print("spawn frames", len(spawns))
        print("service in spawn", any(b"svc-n7" in f for f in spawns))
        print("header in frames", any(b"s3cr3t-otel" in f for _, f in sent))
        procs.stop().get(timeout=60)
        """
    )
    env = client_env()
    env.update(
        DANAUS_TELEMETRY="1",
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_SERVICE_NAME="svc-n7",
        OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer s3cr3t-otel",
        OTEL_EXPORTER_OTLP_TRACES_HEADERS="x-api-key=s3cr3t-otel",
    )
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=90
    )
    assert out.returncode == 0, out.stderr
    assert "env ('svc-n7', '1')" in out.stdout, out.stdout  # telemetry still reaches the proc
    assert "service in spawn True" in out.stdout, out.stdout  # its settings do travel
    assert "header in frames False" in out.stdout, out.stdout
