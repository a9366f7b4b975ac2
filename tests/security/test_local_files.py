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
