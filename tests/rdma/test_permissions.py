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


def _readable_copy_of_our_packages(dest: str) -> str:
    """Copy the top-level packages the client imports into ``dest`` (world-readable).

    The checkout and its virtual environment may lie in a directory only root can
    enter (CI clones into a ``mktemp -d``, mode 0700): the unprivileged user then
    could not import them from where they are. The copy is what the test's
    PYTHONPATH points at, so the user runs exactly this checkout's code."""
    probe = (
        "import sys, danaus.actor, danaus.rdma\n"
        "for m in list(sys.modules.values()):\n"
        "    f = getattr(m, '__file__', None)\n"
        "    if f: print(m.__name__.partition('.')[0], f)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    os.makedirs(dest)
    stdlib = os.path.dirname(os.__file__)
    copied: set[str] = set()
    for line in out.stdout.splitlines():
        top, _, file = line.partition(" ")
        if top in copied or (file.startswith(stdlib + os.sep) and "site-packages" not in file):
            continue
        root = os.path.dirname(file)
        while os.path.basename(root) != top and os.path.dirname(root) != root:
            root = os.path.dirname(root)
        if os.path.basename(root) == top and os.path.isfile(os.path.join(root, "__init__.py")):
            shutil.copytree(
                root, os.path.join(dest, top), ignore=shutil.ignore_patterns("__pycache__")
            )
        elif os.path.basename(file).partition(".")[0] == top:  # a single-file module
            shutil.copy(file, dest)
        else:
            continue
        copied.add(top)
    for dirpath, _dirnames, filenames in os.walk(dest):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    return dest


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
            "PYTHONPATH": _readable_copy_of_our_packages(os.path.join(work, "lib")),
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
