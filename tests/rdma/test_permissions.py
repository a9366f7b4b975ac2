"""Transfers need no privilege: an unprivileged user's client and procs reach each other."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from danaus.actor import Actor, endpoint, this_host
    from danaus.rdma import RDMABuffer

    class Holder(Actor):
        def __init__(self):
            self.data = bytearray(os.urandom(100_000).replace(b"\\0", b"\\1"))
            self.buf = RDMABuffer(self.data)

        @endpoint
        def handle(self):
            return self.buf, bytes(self.data), os.getuid()

        @endpoint
        def read(self, buf):
            dst = bytearray(buf.size())
            buf.read_into(dst).get(timeout=30)
            return bytes(dst)

        @endpoint
        def write(self, buf, data):
            buf.write_from(data).get(timeout=30)

    mine = bytearray(b"owned by the client" * 100)
    client_buf = RDMABuffer(mine)
    procs = this_host().spawn_procs(per_host={"x": 2})
    holders = procs.spawn("h", Holder)
    (b0, d0, uid0), (b1, d1, uid1) = holders.handle.call().get(timeout=30).values()
    assert uid0 == uid1 == os.getuid() != 0
    dst = bytearray(b0.size())
    b0.read_into(dst).get(timeout=30)                                 # client <- proc
    assert dst == d0
    assert holders.slice(x=1).read.call_one(b0).get(timeout=30) == d0  # proc <- sibling
    assert holders.slice(x=0).read.call_one(client_buf).get(timeout=30) == bytes(mine)
    holders.slice(x=1).write.call_one(client_buf, b"written").get(timeout=30)  # proc -> client
    assert mine.startswith(b"written")
    procs.stop().get(timeout=30)
    print("ok")
    """
)


DROP = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]


def _interpreter_for_nobody(env: dict[str, str]) -> str | None:
    """An interpreter the unprivileged user can run *and* spawn again.

    Ours, else the system's ``python3`` (ours may live where that user cannot
    reach, e.g. under ``/root``); danaus and cloudpickle come from PYTHONPATH.
    """
    probe = (
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'import danaus.rdma'], check=True)"
    )
    for exe in (sys.executable, shutil.which("python3", path=os.defpath)):
        if exe is None:
            continue
        r = subprocess.run([*DROP, exe, "-c", probe], env=env, capture_output=True, timeout=30)
        if r.returncode == 0:
            return exe
    return None


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root (to drop to an unprivileged user) and setpriv",
)
def test_an_unprivileged_user_can_read_and_write_between_its_processes() -> None:
    work = tempfile.mkdtemp(prefix="danaus-rdma-nobody-")
    try:
        os.chmod(work, 0o777)
        path = os.path.join(work, "client.py")
        with open(path, "w") as f:
            f.write(SCRIPT)
        os.chmod(path, 0o644)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": work,
            "TMPDIR": work,
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)),
        }
        exe = _interpreter_for_nobody(env)
        if exe is None:
            pytest.skip("no Python interpreter here that an unprivileged user may run")
        out = subprocess.run(
            [*DROP, exe, path], capture_output=True, text=True, timeout=60, cwd=work, env=env
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "ok"
    finally:
        shutil.rmtree(work, ignore_errors=True)
