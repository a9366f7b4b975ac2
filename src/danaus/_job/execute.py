"""Running a command on every proc of a mesh: ``exec_command`` (Monarch's) and the actor
behind it and ``danaus exec``.

Each proc runs the command with its coordinates in the whole mesh in the
environment, under danaus's names (``DANAUS_RANK_HOSTS``, ``DANAUS_SIZE_HOSTS``,
flat ``DANAUS_RANK``/``DANAUS_SIZE``) and Monarch's (``MONARCH_RANK_hosts``,
``MONARCH_SIZE_hosts``: the dimension's label as it is).
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .._actor.api.actor import Actor
from .._actor.api.endpoint import endpoint
from .._actor.api.hosts import HostMesh
from .._actor.core.context import context
from .._actor.core.future import Future

__all__ = ["ExecActor", "exec_command", "parse_env", "rank_env"]


def rank_env() -> tuple[str, dict[str, str]]:
    """``(label, variables)`` for the calling actor's coordinates in its whole mesh (not
    a call's slice): the label names them (``hosts=1,gpus=0``)."""
    point = context().actor_instance.rank
    sizes = {label: point.size(label) for label in dict(point)}
    env: dict[str, str] = {}
    for label, size in sizes.items():
        env[f"DANAUS_RANK_{label.upper()}"] = str(point[label])
        env[f"DANAUS_SIZE_{label.upper()}"] = str(size)
        env[f"MONARCH_RANK_{label}"] = str(point[label])  # as Monarch's BashActor names them
        env[f"MONARCH_SIZE_{label}"] = str(size)
    env["DANAUS_RANK"] = str(point.rank)
    env["DANAUS_SIZE"] = str(math.prod(sizes.values()))
    label = ",".join(f"{k}={point[k]}" for k in sizes) or "0"
    return label, env


def parse_env(items: Sequence[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``KEY=VALUE`` strings (or a dict) as a dict; ``ValueError`` naming a bad one."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        if isinstance(items, str):
            raise TypeError(f"env must be a list of KEY=VALUE strings, got the string {items!r}")
        pairs = []
        for item in items:
            key, sep, value = str(item).partition("=")
            if not sep:
                raise ValueError(f"an environment variable is KEY=VALUE, got {item!r}")
            pairs.append((key, value))
    for key, value in pairs:
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"bad environment variable name {key!r}")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"the value of {key} must be a string without NUL, got {value!r}")
    return dict(pairs)


def python_argv(cmd: list[str]) -> list[str]:
    """``cmd``, with a leading ``FILE.py`` or ``-m MODULE`` run by this proc's Python."""
    if cmd and (cmd[0] == "-m" or cmd[0].endswith(".py")):
        return [sys.executable, *cmd]
    return cmd


class ExecActor(Actor):
    """Runs a command in its proc with the proc's mesh coordinates in the environment."""

    @endpoint
    def run(
        self,
        cmd: list[str],
        cwd: str | None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        output_dir: str | None = None,
    ) -> tuple[str, int, str, str]:
        """``(label, exit code, stdout, stderr)``; the label names the proc's coordinates.

        ``workdir`` is where to run (an error if missing); else the client's ``cwd`` when
        this host has it. With ``output_dir`` (``$SUBDIR`` in it becomes the proc's
        coordinates, ``hosts_1_gpus_0``) the output goes to ``stdout.txt`` and
        ``stderr.txt`` there instead of back to the caller.
        """
        label, rank_vars = rank_env()
        full_env = {**os.environ, **rank_vars, **(env or {})}
        if workdir is not None:
            run_in: str | None = workdir
        else:
            run_in = cwd if cwd is not None and os.path.isdir(cwd) else None
        argv = python_argv(cmd)
        try:
            if output_dir is not None:
                point = context().actor_instance.rank
                subdir = "_".join(f"{k}_{v}" for k, v in dict(point).items())
                where = output_dir.replace("$SUBDIR", subdir)
                os.makedirs(where, exist_ok=True)
                with (
                    open(os.path.join(where, "stdout.txt"), "w") as out,
                    open(os.path.join(where, "stderr.txt"), "w") as err,
                ):
                    done = subprocess.run(argv, env=full_env, cwd=run_in, stdout=out, stderr=err)
                return label, done.returncode, "", ""
            got = subprocess.run(argv, env=full_env, cwd=run_in, capture_output=True, text=True)
        except OSError as e:
            return label, 127, "", f"{shlex.join(argv)}: {e}\n"
        return label, got.returncode, got.stdout, got.stderr


def exit_status(code: int) -> int:
    """A process's exit code as a shell reports it (a signal ``N`` is ``128 + N``)."""
    return code if code >= 0 else min(128 - code, 255)


def exec_command(
    host_mesh: HostMesh,
    cmd: list[str],
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    output_dir: str | None = None,
    rank: int | None = None,
    point: dict[str, int] | None = None,
    per_host: dict[str, int] | None = None,
) -> Future[int]:
    """Run ``cmd`` on procs of ``host_mesh``; a future of the largest exit code (0: all
    succeeded), as Monarch's ``monarch.job.exec_command``.

    ``point`` (host coordinates, ``{"hosts": 1}``) or ``rank`` (a flat host rank) picks
    the hosts, else every host; ``per_host`` procs are spawned on each (default one) and
    each runs ``cmd`` (a leading ``FILE.py`` or ``-m MODULE`` with the procs' Python) with
    ``env`` added to its environment, in ``workdir`` (default: this directory where the
    host has it), and its rank variables (``MONARCH_RANK_<dim>``, ``DANAUS_RANK_<DIM>``).
    The procs' stdout and stderr are printed here, unless ``output_dir`` sends them to
    files on the hosts. The procs are stopped when the command has run everywhere.

    Example:

        rc = exec_command(job.state().hosts, ["nvidia-smi"], per_host={"gpus": 8}).get()
    """
    if not isinstance(cmd, (list, tuple)) or not cmd or not all(isinstance(c, str) for c in cmd):
        raise ValueError(f"cmd must be a non-empty list of strings, got {cmd!r}")
    if rank is not None and point is not None:
        raise ValueError("exec_command takes rank or point, not both")
    env = parse_env(env)
    if point is not None:
        hosts = host_mesh.slice(**point)
    elif rank is not None:
        hosts = host_mesh.flatten("rank").slice(rank=rank)
    else:
        hosts = host_mesh
    argv, cwd = list(cmd), os.getcwd()

    async def run() -> int:
        procs = hosts.spawn_procs(per_host=per_host)
        try:
            actors: Any = procs.spawn("danaus_exec", ExecActor)
            results = await actors.run.call(argv, cwd, env, workdir, output_dir)
            worst = 0
            for _, (_label, code, out, err) in results.items():
                if out:
                    print(out, end="", flush=True)
                if err:
                    print(err, end="", file=sys.stderr, flush=True)
                worst = max(worst, exit_status(code))
            return worst
        finally:
            await procs.stop()

    return Future(coro=run())
