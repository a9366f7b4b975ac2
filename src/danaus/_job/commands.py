"""Monarch's ``monarch.tools.commands`` on danaus's jobs, and the work behind ``danaus
apply``/``exec``/``shell``/``kill``/``context``.

A server handle is ``danaus:///CONTEXT``: the job saved in that context
(``current.py``). ``create(config, name)`` applies ``config.job`` and saves it as
context ``name``; ``info``/``server_ready`` describe it; ``kill`` ends it.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any

from .. import _config as config
from .._actor.api.hosts import HostMesh
from . import current
from .current import (
    DANAUS_DIR,
    DEFAULT_JOB_PATH,
    context_state_path,
    current_job_path,
    load_current_job,
    set_current_job,
)
from .execute import ExecActor, exit_status, parse_env
from .jobs import JobState, JobTrait
from .load import job_load
from .servers import AppState, Config, MeshSpec, ServerSpec
from .shell import shell

# Monarch's ``monarch.tools.commands`` names, which ``danaus.tools.commands`` shows;
# ``parse_point`` and ``run_exec`` serve the ``danaus exec`` command only.
__all__ = [
    "DEFAULT_JOB_PATH",
    "MONARCH_DIR",
    "apply_job",
    "context_create",
    "context_ls",
    "context_rm",
    "context_use",
    "create",
    "exec_on_job",
    "get_or_create",
    "info",
    "kill",
    "kill_and_confirm",
    "load_current_job",
    "server_ready",
    "shell_on_job",
]

#: The directory of danaus's job states and contexts (Monarch's is ``.monarch``).
MONARCH_DIR = DANAUS_DIR
SCHEDULER = "danaus"
TIMEOUT_AFTER_KILL = 300


def parse_point(text: str, what: str = "--point") -> dict[str, int]:
    """``"dim=N,dim=N"`` as a dict; ``ValueError`` naming ``what`` otherwise."""
    out: dict[str, int] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"{what} must look like dim=N[,dim=N], got {text!r}")
        out[key.strip()] = int(value)
    return out


def load_saved(path: str) -> JobTrait:
    """The job saved at ``path`` (``ValueError`` saying to apply one if there is none)."""
    try:
        job = job_load(path)
    except FileNotFoundError:
        raise ValueError(f"no saved job at {path}: run `danaus apply JOB` first") from None
    job._cached_path = path
    return job


# -- contexts ---------------------------------------------------------------------------


def context_create(name: str) -> None:
    """Create context ``name``."""
    current.context_create(name)
    print(f"Created context '{name}'")


def context_use(name: str) -> None:
    """Make ``name`` the active context (created if missing)."""
    current.context_use(name)
    print(f"Switched to context '{name}'")


def context_rm(name: str) -> None:
    """Remove context ``name``, killing its job."""
    error = current.context_rm(name)
    if error is not None:
        print(f"Could not kill the job of context '{name}': {error}", file=sys.stderr)
    print(f"Removed context '{name}'")


def context_ls() -> list[str]:
    """Print the contexts, ``* `` marking the active one; their names."""
    names = current.context_names()
    active = current.current_context()
    for name in names:
        print(f"{'* ' if name == active else '  '}{name}")
    return names


# -- apply, exec, shell -----------------------------------------------------------------


def apply_job(module_path: str | None = None, state_path: str | None = None) -> JobState:
    """Apply the job ``module_path`` names (``myjob.job`` or ``myjob.py:job``), recorded
    as the active context's job; without it, the context's recorded job. Waits until
    every host answers and saves the job (``state_path``, default the context's)."""
    if module_path is not None and state_path is None:
        set_current_job(module_path)
    job = current.import_job(module_path) if module_path is not None else load_current_job()
    path = state_path if state_path is not None else current_job_path()
    t0 = time.monotonic()
    state = job.state(cached_path=path)
    for name, mesh in state._hosts.items():
        mesh.initialized.get(timeout=config.get("exec_timeout"))
        print(f"{name}: {mesh!r} ready", flush=True)
    print(f"Job is ready ({time.monotonic() - t0:.0f}s); saved to {path}", flush=True)
    return state


def _read_script(script: str | None) -> str | None:
    if script is None:
        return None
    if script == "-":
        return sys.stdin.read()
    with open(script) as f:
        return f.read()


def run_exec(
    state_path: str,
    cmd: list[str],
    *,
    target: str = "one",
    mesh_name: str | None = None,
    point: dict[str, int] | None = None,
    per_host: dict[str, int] | None = None,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    kill: bool = False,
    labels: bool = True,
) -> int:
    """Run ``cmd`` on the procs of the job saved at ``state_path``; the largest exit code.

    ``target``: ``"all"`` ranks, rank 0 (``"one"``) or the slice ``point`` of the mesh
    ``mesh_name`` (default: the job's first) with ``per_host`` procs per host; ``"all"``
    without ``mesh_name`` runs on every rank of every mesh, as Monarch's ``--all``. Each
    rank's output is printed prefixed by its coordinates (``labels``; with the mesh's name
    first when several meshes run it) or as it is. ``kill`` ends the job afterwards.
    """
    if not cmd:
        raise ValueError("no command given: danaus exec [--all|--one|--point ...] -- CMD ...")
    job = load_saved(state_path)
    state = job.state(cached_path=state_path)
    meshes = state._hosts
    if not meshes:
        raise RuntimeError("the job has no host meshes")
    if mesh_name is not None and mesh_name not in meshes:
        raise ValueError(f"the job has no mesh {mesh_name!r}; its meshes are {sorted(meshes)}")
    if target == "all" and mesh_name is None and point is None:
        names = list(meshes)
    else:
        names = [mesh_name or next(iter(meshes))]
    worst = 0
    for name in names:
        prefix = f"{name} " if len(names) > 1 else ""
        code = _exec_on_mesh(
            meshes[name], cmd, target, point, per_host, env, workdir, labels, prefix
        )
        worst = max(worst, code)
    if kill:
        job.kill()
    return worst


def _exec_on_mesh(
    hosts: HostMesh,
    cmd: list[str],
    target: str,
    point: dict[str, int] | None,
    per_host: dict[str, int] | None,
    env: dict[str, str] | None,
    workdir: str | None,
    labels: bool,
    prefix: str,
) -> int:
    """``run_exec`` on one mesh: its largest exit code."""
    procs = hosts.spawn_procs(per_host=per_host)
    worst = 0
    try:
        # Spawned on the whole mesh, so every actor knows its coordinates in it.
        actors: Any = procs.spawn("danaus_exec", ExecActor)
        if point is not None:
            unknown = set(point) - set(procs.sizes)
            if unknown:
                raise ValueError(
                    f"--point names {sorted(unknown)}; the dimensions are {procs.sizes}"
                )
            actors = actors.slice(**point)
        elif target != "all":
            actors = actors.slice(**dict.fromkeys(procs.sizes, 0))
        results = actors.run.call(cmd, os.getcwd(), env or {}, workdir, None).get(
            timeout=config.get("exec_timeout")
        )
        for _, (label, code, out, err) in results.items():
            if labels:
                for stream, text in ((sys.stdout, out), (sys.stderr, err)):
                    for line in text.splitlines():
                        print(f"[{prefix}{label}] {line}", file=stream)
                if code != 0:
                    print(f"[{prefix}{label}] exited with {code}", file=sys.stderr)
            else:
                print(out, end="")
                print(err, end="", file=sys.stderr)
            worst = max(worst, exit_status(code))
        sys.stdout.flush()
    finally:
        procs.stop().get(timeout=60)
    return worst


def exec_on_job(
    cmd: list[str],
    run_all: bool = False,
    mesh_name: str | None = None,
    point_str: str | None = None,
    env: list[str] | None = None,
    workdir: str | None = None,
    kill: bool = False,
    script: str | None = None,
    per_host: dict[str, int] | None = None,
) -> int:
    """Run ``cmd`` (or the bash ``script``: a file, ``"-"`` for stdin) on the current
    job's procs; the largest exit code. As Monarch's: ``run_all`` every rank, ``mesh_name``
    every rank of that mesh, ``point_str`` (``"hosts=1"``) one coordinate, else rank 0;
    ``env`` is ``KEY=VALUE`` strings; ``kill`` ends the job afterwards. The job is the one
    saved in the active context (not re-applied from its spec); output is printed here,
    each line prefixed by its rank's coordinates."""
    text = _read_script(script)
    if text is not None:
        cmd = ["bash", "-c", text]
    target = "all" if run_all or (mesh_name is not None and point_str is None) else "one"
    return run_exec(
        current_job_path(),
        list(cmd),
        target=target,
        mesh_name=mesh_name,
        point=parse_point(point_str) if point_str is not None else None,
        per_host=per_host,
        env=parse_env(env),
        workdir=workdir,
        kill=kill,
    )


def run_shell(
    state_path: str,
    *,
    mesh_name: str | None = None,
    point: dict[str, int] | None = None,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    kill: bool = False,
) -> int:
    """A shell on one host of the job saved at ``state_path``: the host at ``point`` of
    ``mesh_name`` (default: the first mesh's first host). Its exit status."""
    job = load_saved(state_path)
    meshes = job.state(cached_path=state_path)._hosts
    if not meshes:
        raise RuntimeError("the job has no host meshes")
    name = mesh_name or next(iter(meshes))
    if name not in meshes:
        raise ValueError(f"the job has no mesh {name!r}; its meshes are {sorted(meshes)}")
    hosts: HostMesh = meshes[name]
    if point is not None:
        unknown = set(point) - set(hosts.sizes)
        if unknown:
            raise ValueError(f"--point names {sorted(unknown)}; the dimensions are {hosts.sizes}")
        hosts = hosts.slice(**point)
    else:
        hosts = hosts.flatten("rank").slice(rank=0)
    code = shell(hosts, env=env, workdir=workdir)
    if kill:
        job.kill()
    return code


def shell_on_job(
    mesh_name: str | None = None,
    point_str: str | None = None,
    env: list[str] | None = None,
    workdir: str | None = None,
    kill: bool = False,
) -> int:
    """A shell on one host of the current job (see ``danaus.job.shell``); its exit status."""
    return run_shell(
        current_job_path(),
        mesh_name=mesh_name,
        point=parse_point(point_str) if point_str is not None else None,
        env=parse_env(env),
        workdir=workdir,
        kill=kill,
    )


# -- servers: a job saved in a context --------------------------------------------------


def _default_name() -> str:
    return f"danaus-{getpass.getuser()}"


def _context_of(server_handle: str) -> str:
    scheme, sep, rest = server_handle.partition("://")
    name = rest.rpartition("/")[2]
    if not sep or scheme != SCHEDULER or not name:
        raise ValueError(
            f"a danaus server handle is 'danaus:///NAME' (NAME a context), got {server_handle!r}"
        )
    return name


def _hostnames(job: JobTrait) -> dict[str, list[str]]:
    workers = getattr(job, "workers", None)
    if isinstance(workers, dict):
        return {name: [w.host for w in ws] for name, ws in workers.items()}
    nodes, sizes = getattr(job, "nodes", None), getattr(job, "_sizes", None)
    if isinstance(nodes, list) and isinstance(sizes, dict):
        it = iter(nodes)
        return {name: [next(it, "") for _ in range(n)] for name, n in sizes.items()}
    names = getattr(job, "_names", None)
    if isinstance(names, list):  # LocalJob: this machine
        return {name: [socket.gethostname()] for name in names}
    return {}


def create(config: Config, name: str | None = None) -> str:
    """Apply ``config.job`` and save it as context ``name`` (default ``danaus-USER``); the
    server handle ``danaus:///NAME``. With ``config.dryrun``, nothing is applied: the
    job's JSON state is returned. ``config.workspace`` is synced to every mesh."""
    if config.appdef is not None or config.scheduler_args:
        raise ValueError(
            "danaus submits no TorchX job: Config(appdef=..., scheduler_args=...) has no "
            "meaning here; give the job to run as Config(job=SlurmJob(...)) instead"
        )
    if not isinstance(config.job, JobTrait):
        raise ValueError(f"Config.job must be a danaus job (JobTrait), got {config.job!r}")
    name = name or _default_name()
    if config.dryrun:
        return config.job.dumps().decode()
    current.context_create(name)
    path = context_state_path(name)
    if config.workspace.dirs:  # syncing needs the hosts: attach to them
        state = config.job.state(cached_path=path)
        for mesh in state._hosts.values():
            mesh.sync_workspace(config.workspace).get()
    else:  # as Monarch's create: the job is scheduled and saved, this process not attached
        job = config.job
        job.dumps()  # a job that cannot be saved raises before it starts anything
        job.apply()
        try:
            job.dump(path)
        except BaseException:
            job.kill()  # not saved: nothing could find it to end it later
            raise
    return f"{SCHEDULER}:///{name}"


def info(server_handle: str) -> ServerSpec | None:
    """The server (saved job) ``server_handle`` names, or ``None`` if none is saved
    there. Its state is ``RUNNING`` while its hosts are (cheap checks: the workers'
    processes and ports, Slurm's word), else ``FAILED``."""
    name = _context_of(server_handle)
    try:
        job = job_load(context_state_path(name))
    except FileNotFoundError:
        return None
    running = job.active and job._still_running()
    state = AppState.RUNNING if running else AppState.FAILED
    meshes = [
        MeshSpec(name=mesh, num_hosts=len(hosts), hostnames=list(hosts), state=state)
        for mesh, hosts in _hostnames(job).items()
    ]
    return ServerSpec(
        name=name,
        state=state,
        meshes=meshes,
        scheduler=SCHEDULER,
        metadata={"kind": job._kind()},
    )


_5_SECONDS = timedelta(seconds=5)


async def server_ready(
    server_handle: str, check_interval: timedelta = _5_SECONDS
) -> ServerSpec | None:
    """The server once it runs (danaus's jobs are running once saved, so this is
    ``info()``), ``None`` if there is none."""
    return await asyncio.get_running_loop().run_in_executor(None, info, server_handle)


async def get_or_create(
    name: str,
    config: Config,
    check_interval: timedelta = _5_SECONDS,
    force_restart: bool = False,
) -> ServerSpec:
    """The running server ``name``; created from ``config`` if there is none (or
    ``force_restart``: killed and created again)."""
    if config.dryrun:
        raise ValueError("dryrun is not supported by get_or_create(); use create()")
    handle = f"{SCHEDULER}:///{name}"
    found = await server_ready(handle, check_interval)
    if found is not None and found.is_running and force_restart:
        await asyncio.get_running_loop().run_in_executor(None, kill, handle)
        found = None
    if found is None or not found.is_running:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, create, config, name)
        found = await server_ready(handle, check_interval)
        if found is None or not found.is_running:
            raise RuntimeError(f"the new server {handle} is not running")
    return found


def kill(server_handle: str) -> None:
    """End the server ``server_handle`` names (its workers or allocation) and remove its
    saved state; ``ValueError`` if there is none."""
    name = _context_of(server_handle)
    load_saved(context_state_path(name)).kill()


def kill_and_confirm(server_handle: str, timeout_after_kill: int = TIMEOUT_AFTER_KILL) -> None:
    """``kill``: danaus's ``kill()`` returns once the workers are signalled and the
    allocation cancelled, and removes the saved state, so ``info()`` is then ``None``."""
    kill(server_handle)
    if info(server_handle) is not None:
        raise RuntimeError(f"{server_handle} is still saved after kill")
