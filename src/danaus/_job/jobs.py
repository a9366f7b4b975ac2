"""Jobs: ``LocalJob`` and ``ProcessJob``, with Monarch's ``apply()`` / ``state()`` / ``kill()``.

A job obtains hosts and hands out one ``HostMesh`` per named mesh::

    job = ProcessJob({"trainers": 2, "dataloaders": 1})
    job.apply()                      # start 3 local worker processes
    trainers = job.state().trainers  # a HostMesh with dimension hosts=2
    ...
    job.kill()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import _config as config
from .._actor.api.hosts import HostMesh, attach_to_workers, this_host
from .._config import NoEffectWarning
from .._runtime.hosting import proc as _proc
from .._transport.address import parse as parse_address
from .._transport.address import split_tcp
from .._transport.auth import new_secret
from .._transport.secret_env import environ_without_secret
from . import statefile
from . import telemetry as _telemetry
from .detach import LISTENING
from .paths import current_job_path
from .statefile import Fields, checked

__all__ = [
    "JobState",
    "JobTrait",
    "LocalJob",
    "ProcessJob",
    "SSHJob",
    "StartedWorker",
]

log = logging.getLogger("danaus.job")

J = TypeVar("J", bound="JobTrait")


class _FromSetting(str):
    """A default that stands for a setting's value (its repr names the setting)."""

    def __repr__(self) -> str:
        return f"<the setting {self!s}>"


#: ``state(cached_path=...)``'s default: the setting ``job_state_path``.
CACHED_PATH = _FromSetting("job_state_path")


def state_path(cached_path: str | None) -> str | None:
    """``cached_path``, or for the default the setting ``job_state_path`` (the active
    context's job state while the setting keeps its default: ``current.py``)."""
    if isinstance(cached_path, _FromSetting):
        return current_job_path()
    return cached_path


def worker_port(port: int | None) -> int:
    """``port``, or the setting ``worker_port``; ``ValueError`` unless a TCP port number."""
    if port is None:
        port = config.get("worker_port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be a TCP port number (1-65535), got {port!r}")
    return port


def client_argv(client_script: Any, python_exe: str) -> list[str]:
    """The batch client's command: ``client_script`` split like a shell; a leading
    ``FILE.py`` is run with ``python_exe``."""
    if not isinstance(client_script, str) or not client_script.strip():
        raise ValueError(
            f"client_script must be a command line ('train.py --lr 0.1' or "
            f"'python -m pkg.train'), got {client_script!r}"
        )
    argv = shlex.split(client_script)
    return [python_exe, *argv] if argv[0].endswith(".py") else argv


# Per process, not a node part: the secret stands in for $DANAUS_SECRET, which is
# the process's. A job may be made before any node exists (making one starts
# none), and jobs and their workers outlive the client session (node) they were
# made in: a later session's jobs must share their secret, since a client
# attaches with one secret only.
_secret_lock = threading.Lock()  # guards _secret, chosen once
_secret: str | None = None


def _job_secret() -> str:
    """The secret this client's jobs share: its own, ``$DANAUS_SECRET``, or one made once.

    A client authenticates with one secret, so every job it starts uses the same.
    """
    global _secret
    rt = _proc.current()
    if rt is not None and rt.secret is not None:
        return rt.secret.decode()
    with _secret_lock:
        if _secret is None:
            _secret = os.environ.get("DANAUS_SECRET") or new_secret()
        return _secret


# The key under which a saved job keeps the attributes its class does not save itself.
_EXTRA = "attributes"


def _json_value(value: Any) -> bool:
    """Whether ``value`` is JSON data that comes back equal from a JSON document."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return not (isinstance(value, float) and value != value)  # NaN != NaN
    if isinstance(value, list):
        return all(_json_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_value(v) for k, v in value.items())
    return False


class JobState:
    """One ``HostMesh`` per named mesh, as attributes (``state.trainers``).

    Made as Monarch makes it: ``JobState({"trainers": mesh, ...})``; the optional
    telemetry, dashboard and admin addresses are kept as given (``None`` unless a
    job sets them). After ``enable_telemetry``, ``state()`` sets
    ``query_engine_client`` (Monarch's ``query(sql)``) and, with
    ``include_dashboard``, ``dashboard_url``.
    """

    def __init__(
        self,
        hosts: Mapping[str, HostMesh],
        query_engine: Any = None,
        query_engine_client: Any = None,
        telemetry_url: str | None = None,
        dashboard_url: str | None = None,
        admin_url: str | None = None,
    ) -> None:
        self._hosts = dict(hosts)
        self.query_engine = query_engine
        self.query_engine_client = query_engine_client
        self.telemetry_url = telemetry_url
        self.dashboard_url = dashboard_url
        self.admin_url = admin_url

    def __getattr__(self, name: str) -> HostMesh:
        hosts = self.__dict__.get("_hosts", {})
        if name in hosts:
            return hosts[name]  # type: ignore[no-any-return]
        raise AttributeError(f"this job has no mesh named {name!r}; its meshes are {sorted(hosts)}")

    def _stop_procs(self) -> None:
        """Stop the procs spawned on these meshes (best effort, bounded).

        Called from a coroutine (``job.kill()`` inside ``async def``), it starts the
        stops and does not wait for them: waiting would block the event loop it
        runs on. The procs are marked stopped at once either way, so their exits
        are expected; their exit reports arrive when the loop runs again.
        """
        in_loop = _running_loop() is not None
        for name, mesh in self._hosts.items():
            try:
                stopping = mesh.stop()
                if in_loop:
                    stopping.add_done_callback(functools.partial(_log_stop_failure, name))
                else:
                    stopping.get(timeout=config.get("job_stop_timeout"))
            except Exception as e:
                _log_stop_failure(name, e)

    def __repr__(self) -> str:
        return f"JobState({', '.join(f'{k}={v!r}' for k, v in self._hosts.items())})"


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _log_stop_failure(name: str, outcome: Any) -> None:
    """Log that mesh ``name`` did not stop cleanly: ``outcome`` is the exception, or a
    finished danaus Future whose exception (if any) is logged."""
    e = outcome
    if not isinstance(outcome, BaseException):
        try:
            outcome.get(timeout=0)
            return
        except Exception as failure:
            e = failure
    log.warning("the job's mesh %r did not stop cleanly: %s: %s", name, type(e).__name__, e)


class JobTrait:
    """The job API: ``apply()`` obtains the hosts, ``state()`` names them, ``kill()`` ends it.

    A job is a specification (the constructor's arguments) plus, once applied,
    what the scheduler handed out (worker addresses, an allocation id, the job
    secret). ``dump()``/``dumps()`` save both as a JSON document (never a
    pickle: reading a job state runs no code), so another client process can
    ``job_load()`` the job and attach to the same workers; ``state()`` does this
    by itself through ``cached_path``.

    Each kind of job says what it saves: ``_to_doc()`` returns its fields as JSON
    values and ``_from_doc(fields)`` reads them back, type-checked. A subclass
    with attributes of its own extends both (calling ``super()``); ``dumps()``
    refuses a job whose attributes would not come back. Attributes a subclass
    does not save itself are saved too when they are JSON values (``None``,
    numbers, strings, lists, string-keyed dicts of those), so a job class
    written for Monarch, which keeps such attributes, saves and loads unchanged.

    Extension points, as Monarch's: ``_create(client_script)`` obtains the hosts
    (and, given a client script, runs it as the batch client), ``_state()``
    returns the ``JobState``, ``can_run(spec)`` says whether this running job can
    serve ``spec``, ``_kill()`` releases the hosts. danaus's own jobs implement
    ``_obtain_hosts()``, ``_meshes()`` and ``_spec()``, which the defaults of the first
    three call.
    """

    # Attributes that live only in this process (processes, attached meshes): not saved.
    _TRANSIENT: tuple[str, ...] = ("_job_state",)
    # The name a saved job gives its class (``_kind()``); a subclass without its own
    # is saved as MODULE.QUALNAME, and loads only where that module was imported.
    _KIND: str | None = None

    def __init__(self) -> None:
        self._applied = False
        self._job_state: JobState | None = None  # what _state() returned, kept while applied
        self._cached: JobTrait | None = None  # the job loaded from the cache that runs us
        self._cached_path: str | None = None
        # enable_telemetry()'s configuration: started by state(); not saved with the job
        self._telemetry_config: _telemetry.TelemetryConfig | None = None

    @property
    def _running(self) -> JobTrait | None:
        if self._cached is not None:
            return self._cached
        return self if self._applied else None

    @property
    def active(self) -> bool:
        return self._running is not None

    def apply(self, client_script: str | None = None) -> None:
        """Obtain the hosts (a no-op if already applied).

        With ``client_script`` (batch mode), the job also runs that client
        (``"train.py --lr 0.1"``: a ``.py`` file first is run with the job's
        Python; or any command) on its own, detached from this process: the
        job is saved to the setting ``job_state_path`` first, so the client's
        ``job.state()`` reconnects to this job's hosts. ``SlurmJob`` runs it
        inside the allocation; ``ProcessJob`` and ``SSHJob`` run it on this
        machine once the workers are up.
        """
        if self._running is not None:
            return
        self._create(client_script)
        self._applied = True

    def _apply_batch(self, client_script: str) -> None:
        raise RuntimeError(
            f"{type(self).__name__} cannot run a batch client (apply(client_script=...)); "
            "use ProcessJob, SSHJob or SlurmJob, or run the client yourself"
        )

    def _save_for_batch_client(self) -> str:
        """Save the job where the batch client's ``state()`` looks (``job_state_path``)."""
        path = current_job_path()
        self.dump(path)
        self._cached_path = path
        return path

    def state(self, cached_path: str | None = CACHED_PATH) -> JobState:
        """The job's meshes, one attribute per mesh name.

        If the job is not applied yet and ``cached_path`` holds a running job
        that ``can_run`` this one, its workers are reused (another client
        applied it); otherwise the job is applied and saved to ``cached_path``
        (default: the setting ``job_state_path``; ``None``: no cache).
        """
        cached_path = state_path(cached_path)
        running = self._running
        if running is None:
            cached = _load_cached(cached_path, self)
            if cached is not None:
                self._cached = cached
                self._cached_path = cached_path
                running = cached
            else:
                if cached_path is not None:
                    self.dumps()  # a job that cannot be saved raises before it starts anything
                self.apply()
                running = self
                if cached_path is not None:
                    try:
                        self.dump(cached_path)
                    except BaseException:
                        self.kill()  # not saved: nothing could find it to end it later
                        raise
                    self._cached_path = cached_path
        if running._job_state is None:
            got = running._state()
            if not isinstance(got, JobState):
                raise TypeError(
                    f"{type(running).__name__}._state() must return a JobState, got {got!r}"
                )
            running._job_state = got
        tcfg = getattr(self, "_telemetry_config", None)
        if tcfg is not None:
            if _telemetry.active_config() is not tcfg:
                _telemetry.start(tcfg)
            _telemetry.fill_state(running._job_state, tcfg)
        return running._job_state

    def remote_mount(self, source: str, mntpoint: str | None = None, **kwargs: Any) -> None:
        """Monarch's FUSE mount of a local directory on the workers: not in danaus.

        Raises ``NotImplementedError``. danaus copies code instead of mounting it:
        ``hosts.sync_workspace(Workspace(dirs=[source]))`` sends the directory to every
        host (only what changed, again when it changes), and ``danaus exec --workdir``
        runs commands there (``docs/jobs.md``, code sync).
        """
        raise NotImplementedError(
            f"remote_mount({source!r}): danaus has no FUSE mounts; send the directory to "
            "the workers with hosts.sync_workspace(Workspace(dirs=[...])) instead "
            "(docs/jobs.md, code sync)"
        )

    def gather_mount(self, remote_mount_point: str, local_mount_point: str, **kwargs: Any) -> None:
        """Monarch's FUSE mount of the workers' directories here: not in danaus.

        Raises ``NotImplementedError``. Read the workers' files with ``danaus exec``
        (``--all -- cat FILE``), ``danaus logs`` for their output, or an actor that
        returns what it reads.
        """
        raise NotImplementedError(
            f"gather_mount({remote_mount_point!r}, {local_mount_point!r}): danaus has no "
            "FUSE mounts; read the workers' files with `danaus exec --all -- cat FILE` or an "
            "actor that returns them"
        )

    def enable_telemetry(
        self: J,
        config: _telemetry.TelemetryConfig | None = None,
        *,
        mesh_admin_config: Any = None,
        **kwargs: Any,
    ) -> J:
        """Start telemetry at the next ``state()`` (Monarch's): OpenTelemetry spans and
        metrics in the client and every proc, exported as the ``OTEL_*`` variables say,
        and with ``include_dashboard`` the web dashboard. ``config`` is a
        ``TelemetryConfig``, or give its fields as keywords. Returns the job, for
        chaining. Starting is best effort: a failure (no ``danaus[telemetry]``) is
        logged and the job runs without. ``mesh_admin_config`` is accepted for Monarch
        programs; danaus has no mesh admin server (its dashboard and ``danaus top``
        show the mesh), so it has no effect, with a ``NoEffectWarning``.
        """
        self._telemetry_config = _telemetry.make_config(config, kwargs)
        if mesh_admin_config is not None:
            warnings.warn(
                "enable_telemetry(mesh_admin_config=...) has no effect in danaus, which has "
                "no mesh admin server: its dashboard and `danaus top` show the mesh",
                NoEffectWarning,
                stacklevel=2,
            )
        return self

    def kill(self) -> None:
        """Release the hosts (also those of a job reconnected from the cache) and drop the cache."""
        running = self._running
        if running is not None:
            if running._job_state is not None:
                running._job_state._stop_procs()  # first, so their exits are expected
            running._kill()
            running._applied = False
            running._job_state = None
        self._cached = None
        self._applied = False
        self._job_state = None
        if self._cached_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._cached_path)
            self._cached_path = None

    def can_run(self, spec: JobTrait) -> bool:
        """Whether this (running) job provides what ``spec`` asks for, so ``spec`` can reuse it."""
        return type(spec) is type(self) and spec._spec() == self._spec()

    def dump(self, filename: str) -> None:
        """Save the job to ``filename`` (see ``dumps``), readable by its owner only (mode
        600: it holds the job secret), in a directory only this user can write (a
        missing one is created mode 700; ``ValueError`` naming the fix otherwise).

        The file is replaced at once (written aside, then renamed), so a client
        loading it meanwhile sees the old or the new job, never half of one.
        """
        statefile.write(filename, self.dumps())

    def dumps(self) -> bytes:
        """The job as a JSON document (see ``job_loads``): specification, what the
        scheduler handed out, the job secret. ``TypeError`` if the job holds
        attributes its kind does not save (see the class docstring)."""
        job = self._cached if self._cached is not None else self
        doc = job._to_doc()
        again = type(job)._restore(statefile.decode(statefile.encode(job._kind(), doc), "")[1])
        extra = {name: vars(job)[name] for name in sorted(set(vars(job)) - set(vars(again)))}
        if extra:  # attributes the class does not save itself: kept when they are JSON data
            bad = sorted(name for name, value in extra.items() if not _json_value(value))
            if bad:
                raise TypeError(
                    f"{type(job).__name__} cannot be saved: its attributes {bad} are not JSON "
                    "data and not part of its saved state. Extend _to_doc() and _from_doc() "
                    "with them, or name them in _TRANSIENT if they live only in this process"
                )
            doc = {**doc, _EXTRA: extra}
        return statefile.encode(job._kind(), doc)

    @classmethod
    def _kind(cls) -> str:
        """The kind a saved job names: the class's own ``_KIND``, else MODULE.QUALNAME."""
        own = cls.__dict__.get("_KIND")
        return own if isinstance(own, str) else f"{cls.__module__}.{cls.__qualname__}"

    @classmethod
    def _restore(cls: type[J], fields: Fields) -> J:
        """A job of this class made from saved ``fields`` (its constructor does not run)."""
        job = cls.__new__(cls)
        JobTrait.__init__(job)
        job._from_doc(fields)
        if fields.has(_EXTRA):
            for name, value in fields.mapping(_EXTRA, lambda v: v, "JSON values").items():
                if (
                    not name.isidentifier()
                    or name in vars(job)
                    or callable(getattr(cls, name, None))
                ):
                    raise ValueError(f"{fields.source}: {_EXTRA} may not set {name!r}")
                setattr(job, name, value)
        for name in cls._TRANSIENT:
            if not hasattr(job, name):
                setattr(job, name, None)
        return job

    def _to_doc(self) -> dict[str, Any]:
        """The fields this kind of job saves, as JSON values (extend it in a subclass)."""
        return {"applied": self._applied}

    def _from_doc(self, fields: Fields) -> None:
        """Set the attributes ``_to_doc`` saved from ``fields`` (extend it in a subclass)."""
        self._applied = fields.boolean("applied")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in self._TRANSIENT:
            state.pop(name, None)
        state["_cached_path"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.pop("_state", None)  # an older danaus kept the JobState there: it would hide _state()
        self.__dict__.update(state)
        self._job_state = None

    def _spec(self) -> Any:
        """What ``can_run`` compares: the job's specification."""
        raise NotImplementedError

    def _still_running(self) -> bool:
        """Whether the hosts a loaded job names are still there (cheap checks only)."""
        return True

    def _create(self, client_script: str | None = None) -> None:
        """Obtain the hosts; with ``client_script``, also run it as the batch client
        (Monarch's extension point; danaus's jobs implement ``_obtain_hosts()`` and
        ``_apply_batch()`` instead)."""
        if client_script is None:
            self._obtain_hosts()
        else:
            self._apply_batch(client_script)

    def _obtain_hosts(self) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} must implement _create(client_script) (as a Monarch job "
            "does) or _obtain_hosts()"
        )

    def _state(self) -> JobState:
        """The applied job's meshes (Monarch's extension point): by default ``_meshes()``."""
        return JobState(self._meshes())

    def _meshes(self) -> dict[str, HostMesh]:
        raise NotImplementedError(
            f"{type(self).__name__} must implement _state() (as a Monarch job does) or _meshes()"
        )

    def _kill(self) -> None:
        pass


def _load_cached(cached_path: str | None, spec: JobTrait) -> JobTrait | None:
    """The running job cached at ``cached_path`` if it can run ``spec``, else None.

    ``ValueError`` (naming the file and the fix) if the file is not this user's own
    private file in a directory only this user can write, or not a job state."""
    if cached_path is None:
        return None
    try:
        data = statefile.read(cached_path)
    except FileNotFoundError:
        return None
    kind, fields = statefile.decode(data, repr(cached_path))
    if kind != spec._kind():
        return None  # another kind of job: left alone, and replaced by ours
    running = type(spec)._restore(fields)
    if running is None or not running.can_run(spec) or not running._still_running():
        return None  # another spec's job: left alone, and replaced by ours
    return running


class LocalJob(JobTrait):
    """Every mesh is this machine (``this_host()``)."""

    _KIND = "LocalJob"

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        super().__init__()
        self._names = list(hosts)

    def _to_doc(self) -> dict[str, Any]:
        return {**super()._to_doc(), "meshes": self._names}

    def _from_doc(self, fields: Fields) -> None:
        super()._from_doc(fields)
        self._names = fields.text_list("meshes")

    def _spec(self) -> Any:
        return self._names

    def _obtain_hosts(self) -> None:
        pass

    def _meshes(self) -> dict[str, HostMesh]:
        return {name: this_host() for name in self._names}


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
        return all(_pid_exists(p) for p in pids) and super()._still_running()  # pids get reused


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


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
