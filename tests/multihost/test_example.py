"""``examples/two_hosts.py`` runs as documented: it builds two hosts, uses them, cleans up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import _ip, client_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "two_hosts.py"


def test_the_two_hosts_example_runs_and_leaves_nothing_behind(network) -> None:
    # ``network`` only for its check that namespaces may be created here.
    out = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=client_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "attached <HostMesh {'hosts': 2}>, spawned <ProcMesh {'hosts': 2, 'gpus': 2}>" in lines
    where = [line for line in lines if "reachable at tcp://" in line]
    assert len(where) == 4 + 2  # every actor, then host 1's actors asked from host 0
    assert len({line.split("net:")[1].split(",")[0] for line in where}) == 2  # two namespaces
    assert lines[-1] == "shut down"
    made = [line.split()[3] for line in lines if line.startswith("worker in netns ")]
    assert len(made) == 2
    left = {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line}
    assert not left & set(made)
