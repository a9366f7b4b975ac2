"""Jobs: ``JobTrait``, with Monarch's ``apply()`` / ``state()`` / ``kill()``, and ``LocalJob``
(``ProcessJob`` and ``SSHJob`` are in ``workers.py``).

A job obtains hosts and hands out one ``HostMesh`` per named mesh:

    job = ProcessJob({"trainers": 2, "dataloaders": 1})
    job.apply()                      # start 3 local worker processes
    trainers = job.state().trainers  # a HostMesh with dimension hosts=2
    ...
    job.kill()
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shlex
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from .. import _config as config
from .._actor.api.hosts import HostMesh, this_host
from .._config import NoEffectWarning
from .._runtime.node import this_node
from .._transport.auth import new_secret
from . import statefile
from . import telemetry as _telemetry
from .paths import current_job_path
from .statefile import Fields

__all__ = [
    "JobState",
    "JobTrait",
    "LocalJob",
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
    node = this_node(start=False)
    rt = None if node is None else node.runtime
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
            node = this_node()  # the public face: the user's ``job.state()`` holds no node
            if _telemetry.active_config() is not tcfg:
                _telemetry.start(node, tcfg)
            _telemetry.fill_state(node, running._job_state, tcfg)
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
