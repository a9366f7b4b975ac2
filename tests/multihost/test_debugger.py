"""The debugger on another host: the paused actor's source lives only on the client's.

The client (a subprocess, so `danaus debug` can find it) runs a script that
the worker's host cannot see: it is written into the directory over which the
worker's mount namespace has its private tmpfs. Its actor class travels by
value; pdb's ``list`` on the remote proc shows the script's lines, fetched
from the client's debug controller.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import Worker, client_env

pexpect = pytest.importorskip("pexpect")

EXPECT_TIMEOUT = 60  # a bound on any one prompt; far above what a healthy step needs

CLIENT = """
import os
import sys

from danaus.actor import Actor, attach_to_workers, endpoint

SCRIPT = os.path.abspath(__file__)


class Debugee(Actor):
    @endpoint
    def sees_script(self):
        return os.path.exists(SCRIPT)

    @endpoint
    def to_debug(self, base):
        x = base + 1
        breakpoint()
        y = x * 2  # only-on-the-client marker
        return y


def say(*words):
    sys.stdout.write(" ".join(str(w) for w in words) + "\\n")
    sys.stdout.flush()


hosts = attach_to_workers(workers=[sys.argv[1]])
procs = hosts.spawn_procs(per_host={"gpus": 1})
mesh = procs.spawn("remote_debugee", Debugee)
say("SEES", mesh.sees_script.call_one().get(timeout=60))
say("RESULT", mesh.to_debug.call_one(10).get())
hosts.shutdown().get(timeout=60)
"""


@pytest.fixture
def debug_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dbg") as d:  # short: Unix socket paths
        yield Path(d)


def _spawn(args: list[str], env: dict[str, str], cwd: Path) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        args,
        env=env,
        cwd=str(cwd),
        encoding="utf-8",
        timeout=EXPECT_TIMEOUT,
        dimensions=(50, 200),
    )
    child.delaybeforesend = None
    return child


@pytest.mark.timeout(180)
def test_pdb_on_another_host_lists_source_that_only_the_client_has(
    fresh_worker: Callable[..., Worker], secret: str, debug_dir: Path
) -> None:
    worker = fresh_worker()  # a host of this test's own: a worker serves one client
    # Visible here, hidden on the worker's host (its tmpfs is mounted over this dir).
    script = Path(worker.socket_dir) / "remote_client.py"
    script.write_text(CLIENT)
    env = {
        **client_env(),
        "DANAUS_SECRET": secret,
        "DANAUS_SOCKET_DIR": str(debug_dir / "s"),
        "DANAUS_DEBUG_TERMINAL": "0",
        "TERM": "dumb",
    }
    children = []
    try:
        client = _spawn([str(script), worker.address], env, debug_dir)
        children.append(client)
        client.expect("SEES False")  # the remote proc cannot read the script
        client.expect("paused in breakpoint")
        dbg = _spawn(["-m", "danaus", "debug"], env, debug_dir)
        children.append(dbg)
        dbg.expect("danaus_dbg> ")
        for _ in range(200):  # until the session has registered
            dbg.sendline("list")
            dbg.expect(r"\((\d+) sessions? paused\)|no paused sessions")
            found = dbg.match.group(1)
            dbg.expect("danaus_dbg> ")
            if found == "1":
                break
        assert found == "1"
        dbg.sendline("attach remote_debugee 0")
        dbg.expect(r"-> y = x \* 2  # only-on-the-client marker")
        dbg.expect(r"\(Pdb\) ")
        dbg.sendline("l")
        dbg.expect(r"breakpoint\(\)")
        dbg.expect(r"return y")
        dbg.expect(r"\(Pdb\) ")
        dbg.sendline("p x")
        dbg.expect(r"\r\n11\r\n")
        dbg.expect(r"\(Pdb\) ")
        dbg.sendline("c")
        dbg.expect("ended: its endpoint finished")
        client.expect(r"RESULT 22")
        dbg.expect("danaus_dbg> ")
        dbg.sendline("quit")
        dbg.expect(pexpect.EOF)
        client.expect(pexpect.EOF)
        client.close()
        assert client.exitstatus == 0, client.before
    finally:
        for child in children:
            if child.isalive():
                child.terminate(force=True)
