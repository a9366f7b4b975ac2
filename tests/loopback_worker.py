"""A ``danaus worker`` on loopback, started by a test and attached with the client's
job secret: its procs are reached over authenticated TCP, as on another host. One
copy, for every suite that needs one (each makes its own, module-scoped)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from danaus._runtime.node import this_node
from danaus._transport.auth import new_secret
from danaus.actor import HostMesh, attach_to_workers

WORKER_START_TIMEOUT = 60.0
REPLY_TIMEOUT = 30.0


@contextlib.contextmanager
def loopback_worker(
    env_extra: dict[str, str] | None = None, stderr: Path | None = None
) -> Iterator[HostMesh]:
    """Start the worker, attach to it, yield its host mesh; shut both down after.

    ``env_extra`` is added to the worker's environment (the client's ``DANAUS_*``
    variables are not passed on); ``stderr``, when given, is where the worker's
    and its procs' stderr goes (to quote when a test fails).
    """
    rt = this_node().runtime
    # A client holds one job secret: reuse it if another suite attached first.
    secret = rt.secret.decode() if rt.secret is not None else new_secret()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANAUS_")}
    env["DANAUS_SECRET"] = secret
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(env_extra or {})
    with contextlib.ExitStack() as files:
        err = files.enter_context(stderr.open("w")) if stderr is not None else None
        worker = subprocess.Popen(
            [sys.executable, "-m", "danaus", "worker", "--listen", "tcp://127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
            start_new_session=True,
        )
    assert worker.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    stream = worker.stdout
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    try:
        try:
            line = lines.get(timeout=WORKER_START_TIMEOUT)
        except queue.Empty:
            line = ""
        assert line.startswith("danaus worker listening on "), f"worker said {line!r}"
        hm = attach_to_workers(workers=[line.split()[-1]], secret=secret)
        assert hm.initialized.get(timeout=REPLY_TIMEOUT) is True
        yield hm
        with contextlib.suppress(Exception):
            hm.shutdown().get(timeout=REPLY_TIMEOUT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(timeout=REPLY_TIMEOUT)
    finally:
        if worker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        stream.close()
