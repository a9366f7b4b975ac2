"""Jobs whose workers run as detached ``danaus worker`` processes: ``ProcessJob`` (on
this host) and ``SSHJob`` (over ssh), and what they share (``StartedWorker``, starting
and stopping workers)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _config as config
from .._actor.api.hosts import HostMesh
from .._actor.api.joining import attach_to_workers
from .._runtime.messaging.liveness import pid_exists
from .._transport.address import parse as parse_address
from .._transport.address import split_tcp
from .._transport.secret_env import environ_without_secret
from .detach import LISTENING
from .jobs import JobTrait, _job_secret, client_argv, worker_port
from .statefile import Fields, checked

__all__ = ["ProcessJob", "SSHJob", "StartedWorker", "start_detached"]

log = logging.getLogger("danaus.job")


@dataclass(frozen=True)
class StartedWorker:
    """A worker a job started: the host it was asked for, its address, its pid there."""

    host: str
    address: str
    pid: int


def _str_list(value: Any) -> list[str]:
    return list(
        checked(value, lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
    )


def _started_workers(value: Any) -> list[StartedWorker]:
    return [
        StartedWorker(
            checked(w["host"], lambda v: isinstance(v, str)),
            checked(w["address"], lambda v: isinstance(v, str)),
            checked(w["pid"], lambda v: isinstance(v, int) and not isinstance(v, bool)),
        )
        for w in checked(value, lambda v: isinstance(v, list))
    ]


def _check_mesh_name(name: Any) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"mesh names must be identifiers, got {name!r}")


class _DetachedWorkersJob(JobTrait):
    """A job whose workers run detached (``danaus worker --detach``), one per host.

    Subclasses say how to run a command on a host (``_launch``) and how to end a
    worker (``_stop``). The workers outlive this client, so a client that loads
    the job from its cache attaches to the same ones.
    """

    def __init__(self, hosts: Mapping[str, Sequence[str]]) -> None:
        super().__init__()
        self._hosts = {name: list(hs) for name, hs in hosts.items()}
        self._secret = _job_secret()
        self._workers: dict[str, list[StartedWorker]] = {}
        self.client_pid: int | None = None  # the batch client (apply(client_script=...))
        self.client_log: str | None = None

    def _to_doc(self) -> dict[str, Any]:
        workers = {
            name: [{"host": w.host, "address": w.address, "pid": w.pid} for w in ws]
            for name, ws in self._workers.items()
        }
        return {
            **super()._to_doc(),
            "hosts": self._hosts,
            "secret": self._secret,
            "workers": workers,
            "client_pid": self.client_pid,
            "client_log": self.client_log,
        }

    def _from_doc(self, fields: Fields) -> None:
        super()._from_doc(fields)
        self._hosts = fields.mapping("hosts", _str_list, "lists of host names")
        self._secret = fields.text("secret")
        self._workers = fields.mapping(
            "workers", _started_workers, 'lists of workers {"host", "address", "pid"}'
        )
        self.client_pid = fields.opt_integer("client_pid")
        self.client_log = fields.opt_text("client_log")

    def _launch(self, host: str) -> tuple[list[str], dict[str, str] | None]:
        """``(argv, env)`` that runs ``danaus worker --detach`` for ``host``."""
        raise NotImplementedError

    def _where(self, host: str) -> str:
        return f"host {host!r}"

    def _start(self, host: str) -> StartedWorker:
        argv, env = self._launch(host)
        timeout = config.get("worker_start_timeout")
        try:
            out = subprocess.run(
                argv,
                input=self._secret + "\n",  # the secret travels on stdin, never in argv
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(
                f"{type(self).__name__}: starting a worker on {self._where(host)} took longer "
                f"than {timeout:g} s: {' '.join(argv)}: {_text(e.stderr)}"
            ) from None
        words = out.stdout.strip().splitlines()[-1].split() if out.stdout.strip() else []
        if out.returncode != 0 or len(words) < 7 or not out.stdout.startswith(LISTENING):
            raise RuntimeError(
                f"{type(self).__name__}: could not start a worker on {self._where(host)}: "
                f"`{' '.join(argv)}` exited with {out.returncode}: "
                f"{(out.stderr.strip() or out.stdout.strip() or '(no output)')}"
            )
        # danaus worker listening on ADDR pid PID log PATH
        return StartedWorker(host, words[4], int(words[6]))

    def _obtain_hosts(self) -> None:
        todo = [(name, h) for name, hs in self._hosts.items() for h in hs]
        with concurrent.futures.ThreadPoolExecutor(max(1, min(32, len(todo)))) as pool:
            futures = [pool.submit(self._start, h) for _, h in todo]
            concurrent.futures.wait(futures)
        started = [f.result() for f in futures if f.exception() is None]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            self._stop_all(started)
            raise errors[0]  # type: ignore[misc]
        it = iter(started)
        self._workers = {name: [next(it) for _ in hs] for name, hs in self._hosts.items()}

    def _meshes(self) -> dict[str, HostMesh]:
        return {
            name: attach_to_workers(workers=[w.address for w in ws], secret=self._secret)
            for name, ws in self._workers.items()
        }

    def _apply_batch(self, client_script: str) -> None:
        """Start the workers, save the job, then run the client detached on this machine."""
        argv = client_argv(client_script, sys.executable)
        self.dumps()  # a job that cannot be saved raises before it starts anything
        self._obtain_hosts()
        self._applied = True
        try:
            path = self._save_for_batch_client()
            log = os.path.join(
                os.path.dirname(os.path.abspath(path)),
                f"batch-client-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-"
                f"{secrets.token_hex(4)}.log",  # created O_EXCL: two in one second differ
            )
            self.client_pid = start_detached(argv, log)
        except BaseException:
            self.kill()  # its workers would be left running with no saved job to end them
            raise
        self.client_log = log

    def _stop(self, worker: StartedWorker) -> None:
        raise NotImplementedError

    def _stop_all(self, workers: list[StartedWorker]) -> None:
        if not workers:
            return
        try:
            with concurrent.futures.ThreadPoolExecutor(min(32, len(workers))) as pool:
                list(pool.map(self._stop, workers))
        except RuntimeError:
            # At interpreter exit (hosts_from_config's workers end in an atexit hook)
            # a pool takes no work: one by one, or the workers outlive the program.
            for worker in workers:
                self._stop(worker)

    def _kill(self) -> None:
        self._stop_all([w for ws in self._workers.values() for w in ws])
        self._workers = {}

    def _still_running(self) -> bool:
        """Whether every worker still accepts connections at its address (probed at once,
        each within the setting ``job_probe_timeout``)."""
        addresses = [w.address for ws in self._workers.values() for w in ws]
        if not addresses:
            return False
        with concurrent.futures.ThreadPoolExecutor(min(32, len(addresses))) as pool:
            return all(pool.map(_accepting, addresses))

    @property
    def workers(self) -> dict[str, list[StartedWorker]]:
        """The workers started, per mesh (empty before ``apply()``)."""
        return {name: list(ws) for name, ws in self._workers.items()}


# Runs in a short-lived launcher: the client becomes nobody's child here, in its own session.
# Its log is new and its owner's only (it holds every proc's output, maybe the dashboard's
# token): created O_EXCL | O_NOFOLLOW, mode 600.
_LAUNCH = (
    "import os, subprocess, sys\n"
    "flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW\n"
    "out = os.fdopen(os.open(sys.argv[1], flags, 0o600), 'ab')\n"
    "p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=out,\n"
    "                     stderr=subprocess.STDOUT, start_new_session=True)\n"
    "print(p.pid)\n"
)


def start_detached(argv: list[str], log: str) -> int:
    """Start ``argv`` in a session of its own, output to ``log`` (a new file, mode 600);
    its pid. It is not this process's child, so it outlives this process and needs no
    reaping."""
    out = subprocess.run(
        [sys.executable, "-c", _LAUNCH, log, *argv],
        stdin=subprocess.DEVNULL,
        env=environ_without_secret(),  # a batch client reads the secret from the saved job
        capture_output=True,
        text=True,
        timeout=config.get("worker_start_timeout"),
    )
    if out.returncode != 0 or not out.stdout.strip().isdigit():
        raise RuntimeError(f"could not start {shlex.join(argv)}: {out.stderr.strip()}")
    return int(out.stdout.strip())


def _text(data: Any) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace").strip()
    return (data or "").strip()


def _count(value: Any) -> int:
    return int(checked(value, lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0))


def _string(value: Any) -> str:
    return str(checked(value, lambda v: isinstance(v, str)))


class ProcessJob(_DetachedWorkersJob):
    """Hosts as local ``danaus worker`` processes, for development and tests.

    ``ProcessJob({"trainers": 2})`` starts two workers on 127.0.0.1 with the
    client's job secret; ``state().trainers`` is a ``HostMesh`` of ``hosts=2``.
    The workers run in sessions of their own until ``kill()``, so a second
    client can reconnect to them through the cached job state.
    """

    _KIND = "ProcessJob"

    def __init__(self, meshes: Mapping[str, int], env: Mapping[str, str] | None = None) -> None:
        for name, n in meshes.items():
            _check_mesh_name(name)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"mesh {name!r} needs a host count >= 1, got {n!r}")
        super().__init__({name: ["127.0.0.1"] * n for name, n in meshes.items()})
        self._sizes = dict(meshes)
        self._env = dict(env or {})

    def _to_doc(self) -> dict[str, Any]:
        return {**super()._to_doc(), "sizes": self._sizes, "env": self._env}

    def _from_doc(self, fields: Fields) -> None:
        super()._from_doc(fields)
        self._sizes = fields.mapping("sizes", _count, "host counts")
        self._env = fields.mapping("env", _string, "strings")

    def _spec(self) -> Any:
        return (self._sizes, self._env)

    def _where(self, host: str) -> str:
        return "this machine"

    def _launch(self, host: str) -> tuple[list[str], dict[str, str] | None]:
        env = {
            **environ_without_secret(),  # the secret goes on stdin
            **self._env,
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        argv = [sys.executable, "-m", "danaus", "worker", "--listen", f"tcp://{host}:0"]
        return [*argv, "--secret-file", "-", "--detach"], env

    def _stop(self, worker: StartedWorker) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.pid, signal.SIGKILL)  # its session: worker, zygote, procs

    def _still_running(self) -> bool:
        pids = (w.pid for ws in self._workers.values() for w in ws)
        return all(pid_exists(p) for p in pids) and super()._still_running()  # pids get reused


def _accepting(address: str) -> bool:
    """Whether something accepts TCP connections at ``address`` (closed at once, before
    any handshake: the worker drops it); an address of another scheme is not probed."""
    scheme, rest = parse_address(address)
    if scheme != "tcp":
        return True
    host, port = split_tcp(rest)
    try:
        with socket.create_connection((host, port), timeout=config.get("job_probe_timeout")):
            return True
    except OSError:
        return False


class SSHJob(_DetachedWorkersJob):
    """Workers started over ``ssh`` on hosts you can log in to.

    ``SSHJob(["node1", "node2"])`` gives one mesh named ``hosts``;
    ``SSHJob({"trainers": ["node1", "node2"], "eval": ["node3"]})`` names them.
    On every host it runs ``PYTHON_EXE -m danaus worker --detach`` listening on
    the host's address (as this client resolves it) and ``port`` (default:
    the setting ``worker_port``, 26600); the job
    secret goes over ssh's stdin. ``ssh_args`` are passed to ``ssh`` first
    (``-p 2222``, ``-i KEY``, ``-o ...``); ``ssh`` runs non-interactively
    (``BatchMode=yes``), so keys or an agent must be set up. ``kill()`` ends
    the workers over ssh.
    """

    _KIND = "SSHJob"

    def __init__(
        self,
        hosts: Sequence[str] | Mapping[str, Sequence[str]],
        python_exe: str = "python3",
        ssh_args: Sequence[str] = (),
        port: int | None = None,
    ) -> None:
        if isinstance(hosts, str):
            raise TypeError(f"hosts must be a list of host names (or a dict), got {hosts!r}")
        meshes = dict(hosts) if isinstance(hosts, Mapping) else {"hosts": list(hosts)}
        if not meshes:
            raise ValueError("SSHJob needs at least one mesh of hosts")
        for name, hs in meshes.items():
            _check_mesh_name(name)
            if isinstance(hs, str) or not hs or not all(isinstance(h, str) and h for h in hs):
                raise ValueError(f"mesh {name!r} needs a non-empty list of host names, got {hs!r}")
            seen = [_address_of(h) for h in hs]
            if len(set(seen)) != len(seen):
                raise ValueError(
                    f"mesh {name!r} names one host twice ({hs!r}): one worker per host and port"
                )
        port = worker_port(port)
        if isinstance(ssh_args, str):
            raise TypeError(f"ssh_args must be a list of arguments, got the string {ssh_args!r}")
        super().__init__(meshes)
        self._python_exe = python_exe
        self._ssh_args = list(ssh_args)
        self._port = port

    def _to_doc(self) -> dict[str, Any]:
        return {
            **super()._to_doc(),
            "python_exe": self._python_exe,
            "ssh_args": self._ssh_args,
            "port": self._port,
        }

    def _from_doc(self, fields: Fields) -> None:
        super()._from_doc(fields)
        self._python_exe = fields.text("python_exe")
        self._ssh_args = fields.text_list("ssh_args")
        self._port = fields.integer("port")

    def _spec(self) -> Any:
        return (self._hosts, self._python_exe, self._ssh_args, self._port)

    def _ssh(self, host: str, command: list[str]) -> list[str]:
        # "--": a host that starts with "-" ("-oProxyCommand=...") is a destination, not
        # an option of ssh's.
        return ["ssh", *self._ssh_args, "-o", "BatchMode=yes", "--", host, shlex.join(command)]

    def _launch(self, host: str) -> tuple[list[str], dict[str, str] | None]:
        listen = f"tcp://{_resolve(host)}:{self._port}"
        worker = [self._python_exe, "-m", "danaus", "worker", "--listen", listen]
        argv = self._ssh(host, [*worker, "--secret-file", "-", "--detach"])
        return argv, environ_without_secret()

    def _stop(self, worker: StartedWorker) -> None:
        subprocess.run(
            self._ssh(worker.host, ["kill", "-KILL", "--", f"-{worker.pid}"]),
            stdin=subprocess.DEVNULL,
            env=environ_without_secret(),
            capture_output=True,
            timeout=config.get("worker_start_timeout"),
        )


def _address_of(host: str) -> str:
    """The host part of an ssh destination (``user@host`` -> ``host``)."""
    return host.rpartition("@")[2]


def _resolve(host: str) -> str:
    name = _address_of(host)
    try:
        return str(socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except OSError as e:
        raise RuntimeError(f"SSHJob: cannot resolve host {host!r}: {e}") from None
