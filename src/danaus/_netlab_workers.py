"""The host lab's workers (``danaus._netlab``'s hosts, each running ``danaus worker``):
starting them in a host's namespace and reaping them, filling the disk under one, and
``lab()``, a network of hosts with a worker in each, torn down on exit.

Stdlib only, like ``_netlab``, whose network, hosts and links these run on.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from ._netlab import (
    DATACENTER,
    DIE_WITH_PARENT,
    SRC,
    WORKER_START_TIMEOUT,
    WORKER_STOP_TIMEOUT,
    Host,
    Link,
    Network,
    _run,
)

# -- workers -------------------------------------------------------------------------


@dataclass
class Worker:
    host: Host
    proc: subprocess.Popen[str]
    address: str
    socket_dir: str

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: worker + zygote
        self.proc.wait(timeout=WORKER_STOP_TIMEOUT)


def python_path() -> str:
    """``PYTHONPATH`` that finds this danaus first."""
    return os.pathsep.join(
        [str(SRC), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )


def worker_env(secret: str, socket_dir: str, extra: Mapping[str, str] = {}) -> dict[str, str]:
    """A worker's environment: no inherited danaus settings, then ``extra`` (``DANAUS_*``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANAUS_")}
    env.update(
        DANAUS_SECRET=secret,
        DANAUS_SOCKET_DIR=socket_dir,
        PYTHONPATH=python_path(),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


# Inside the worker's own mount namespace: a private tmpfs for its Unix sockets.
# ``DANAUS_NETLAB_TMPFS_SIZE`` (when set) caps it, so a test can fill the disk under it.
_WORKER_SH = (
    'mount -t tmpfs -o "mode=0700${DANAUS_NETLAB_TMPFS_SIZE:+,size=$DANAUS_NETLAB_TMPFS_SIZE}" '
    'danaus "$DANAUS_SOCKET_DIR" && exec "$0" -m danaus worker --listen "$1"'
)


def start_worker(
    host: Host, secret: str, env: Mapping[str, str] = {}, state_size: str | None = None
) -> Worker:
    """Start ``danaus worker`` in ``host``'s namespace; returns once it listens.

    ``env``: settings for the worker on top of the lab's (heartbeats, for instance).
    ``state_size`` (``"64m"``, as ``mount -o size=`` takes it): the worker's job state
    and its logs (``log_dir``) share one tmpfs of that size, which a fault can fill
    (`fill_state()`); default: its sockets on an uncapped tmpfs, logs where
    ``log_dir`` says.
    """
    return _listening(_launch(host, secret, env, state_size))


def start_workers(
    hosts: Sequence[Host], secret: str, env: Mapping[str, str] = {}, state_size: str | None = None
) -> list[Worker]:
    """``start_worker`` on each of ``hosts``, all starting at once (each worker's imports,
    ``zygote_preload``'s included, wait for no other's); returns once every one listens.
    Started from this thread: a worker dies with the thread that started it
    (``PR_SET_PDEATHSIG``), so not from a pool's. If one fails, the others are reaped."""
    launched: list[tuple[Host, subprocess.Popen[str], str]] = []
    workers: list[Worker] = []
    try:
        for host in hosts:
            launched.append(_launch(host, secret, env, state_size))
        while launched:
            workers.append(_listening(launched.pop(0)))
    except BaseException:
        for w in workers:
            reap(w)
        for host, proc, socket_dir in launched:
            reap(Worker(host, proc, "", socket_dir))
        raise
    return workers


def _launch(
    host: Host, secret: str, env: Mapping[str, str], state_size: str | None
) -> tuple[Host, subprocess.Popen[str], str]:
    socket_dir = f"/tmp/{host.netns}-{secrets.token_hex(3)}-sock"
    os.mkdir(socket_dir, 0o700)
    argv = host.exec_argv("sh", "-c", _WORKER_SH, sys.executable)
    extra = dict(env)
    if state_size is not None:
        if not re.fullmatch(r"\d+[kmg]?", state_size):
            raise ValueError(f"state_size {state_size!r} is not a tmpfs size: write e.g. '64m'")
        extra.update(DANAUS_NETLAB_TMPFS_SIZE=state_size, DANAUS_LOG_DIR=f"{socket_dir}/logs")
    proc = subprocess.Popen(
        [*DIE_WITH_PARENT, *argv, f"tcp://{host.ip}:0"],
        env=worker_env(secret, socket_dir, extra),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return host, proc, socket_dir


def _listening(launched: tuple[Host, subprocess.Popen[str], str]) -> Worker:
    """The worker ``_launch`` started, once it says where it listens."""
    host, proc, socket_dir = launched
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    stream = proc.stdout

    def read_first_line() -> None:
        try:
            lines.put(stream.readline())
        except (OSError, ValueError):  # closed under us: the worker was given up on
            lines.put("")

    threading.Thread(target=read_first_line, daemon=True).start()
    try:
        line = lines.get(timeout=WORKER_START_TIMEOUT)
    except queue.Empty:
        line = ""
    prefix = "danaus worker listening on "
    if not line.startswith(prefix):
        reap(Worker(host, proc, "", socket_dir))
        raise RuntimeError(
            f"the worker in {host.netns} did not start within {WORKER_START_TIMEOUT} s "
            f"(exit code {proc.poll()}, said {line!r})"
        )
    address = line[len(prefix) :].strip()
    if not address.startswith(f"tcp://{host.ip}:"):
        reap(Worker(host, proc, "", socket_dir))
        raise RuntimeError(f"the worker in {host.netns} listens on {address}, not on {host.ip}")
    worker = Worker(host, proc, address, socket_dir)
    host.worker = worker
    return worker


_FILL_SH = 'cat /dev/zero > "$1/fill" 2>/dev/null; df -k "$1" | tail -1'


def fill_state(worker: Worker) -> str:
    """Fill the tmpfs under ``worker``'s job state and logs (started with ``state_size``)
    to the last byte; returns ``df``'s line for it. `free_state()` undoes it."""
    r = _run(["nsenter", "-t", str(worker.proc.pid), "-m", "sh", "-c", _FILL_SH, "sh",
              worker.socket_dir])  # fmt: skip
    return r.stdout.strip()


def free_state(worker: Worker) -> None:
    """Remove what `fill_state()` wrote (nothing if the worker is gone)."""
    if worker.proc.poll() is None:
        _run(["nsenter", "-t", str(worker.proc.pid), "-m", "rm", "-f",
              f"{worker.socket_dir}/fill"], check=False)  # fmt: skip


def host_pids(host: Host) -> list[int]:
    """Every process in ``host``'s network namespace (its worker, zygote and procs)."""
    inode = host.netns_inode
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                    out.append(int(entry))
    return out


def reap(worker: Worker) -> None:
    """Kill ``worker`` (and its procs) and remove its socket directory."""
    try:
        worker.kill()
    finally:
        if worker.proc.stdout is not None:
            worker.proc.stdout.close()
        # Its tmpfs is only mounted in the worker's mount namespace: what is here is
        # what processes of this namespace put under it (a test hiding a file from
        # the worker, say), which goes too.
        shutil.rmtree(worker.socket_dir, ignore_errors=True)


@contextlib.contextmanager
def lab(
    n: int,
    link: Link = DATACENTER,
    workers: bool = True,
    secret: str | None = None,
    worker_settings: Mapping[str, str] = {},
) -> Iterator[tuple[Network, list[Worker]]]:
    """``n`` hosts (and a worker in each, if ``workers``), torn down on exit."""
    if n < 1:
        raise ValueError(f"a lab needs at least 1 host, not {n}")
    net = Network.make(link)
    started: list[Worker] = []
    try:
        hosts = [net.add_host() for _ in range(n)]
        if workers:
            key = secret or secrets.token_hex(32)
            for host in hosts:
                started.append(start_worker(host, key, worker_settings))
        yield net, started
    finally:
        for w in started:
            with contextlib.suppress(Exception):
                reap(w)
        net.destroy()
