"""``danaus top`` and ``danaus stack``, run as commands against a live client."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import danaus.dashboard
from danaus.actor import ProcMesh
from danaus.testing import client_env

from .conftest import REPLY_TIMEOUT, Worker, proc_names


def _danaus(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "danaus", *args],  # the `danaus` command
        env=env or client_env(),
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_top_once_prints_every_proc_and_actor_with_its_counts(
    dashboard: danaus.dashboard.Dashboard, procs: ProcMesh
) -> None:
    mesh = procs.spawn("topped", Worker)
    for _ in range(3):
        mesh.ping.call().get(timeout=REPLY_TIMEOUT)
    out = _danaus("top", "--once", "--url", dashboard.url)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("danaus top - client ")
    for rank in range(2):
        [name] = proc_names(procs.slice(gpus=rank))
        [row] = [r for r in lines if f"topped[{rank}]" in r]
        assert row.split()[:3] == [name, f"{{gpus={rank}}}", "alive"]
        assert row.split()[4:7] == ["Worker", "3", "-"] or row.split()[4:6] == ["Worker", "3"]


def test_top_refreshes_in_place_for_the_iterations_asked(
    dashboard: danaus.dashboard.Dashboard, procs: ProcMesh
) -> None:
    out = _danaus("top", "--url", dashboard.url, "--iterations", "2", "--interval", "0.1")
    assert out.returncode == 0, out.stderr
    assert "danaus top - client" in out.stdout


def test_stack_dumps_the_procs_of_a_mesh_at_coordinates(
    dashboard: danaus.dashboard.Dashboard, procs: ProcMesh
) -> None:
    mesh = procs.spawn("cli_stacked", Worker)
    held = mesh.slice(gpus=0).hold.call_one("cli-dump", REPLY_TIMEOUT)
    try:
        out = _danaus("stack", "cli_stacked", "gpus=0", "--url", dashboard.url)
    finally:
        procs.slice(gpus=0).spawn("cli_releaser", Worker).release.call_one("cli-dump").get(
            timeout=REPLY_TIMEOUT
        )
    assert held.get(timeout=REPLY_TIMEOUT) is True
    assert out.returncode == 0, out.stderr
    [p0], [p1] = proc_names(procs.slice(gpus=0)), proc_names(procs.slice(gpus=1))
    assert out.stdout.startswith(f"=== proc {p0} ===")
    assert "hold" in out.stdout and p1 not in out.stdout


def test_stack_says_what_is_wrong(dashboard: danaus.dashboard.Dashboard) -> None:
    out = _danaus("stack", "no_such_mesh", "--url", dashboard.url)
    assert out.returncode == 2
    assert "no mesh 'no_such_mesh'" in out.stderr
    out = _danaus("stack", "--url", dashboard.url)
    assert out.returncode == 2 and "say which procs" in out.stderr


def test_the_commands_find_the_dashboard_of_the_one_client_serving_one() -> None:
    with tempfile.TemporaryDirectory() as d:
        env = {**client_env(), "DANAUS_SOCKET_DIR": d}
        out = _danaus("top", "--once", env=env)
        assert out.returncode == 2 and "no running danaus client serves a dashboard" in out.stderr
        code = (
            "import sys, danaus.dashboard\n"
            "from danaus.actor import this_host\n"
            "pm = this_host().spawn_procs(per_host={'gpus': 2}, name='found')\n"
            "pm.initialized.get(timeout=30)\n"
            "danaus.dashboard.serve()\n"
            "print('READY', flush=True)\n"
            "sys.stdin.readline()\n"
        )
        with subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as client:
            try:
                assert client.stdout is not None
                assert client.stdout.readline().strip() == "READY"
                out = _danaus("top", "--once", env=env)
                assert out.returncode == 0, out.stderr
                assert f"(pid {client.pid})" in out.stdout and "2 procs (2 alive)" in out.stdout
            finally:
                client.kill()
    assert not os.path.exists(d)
