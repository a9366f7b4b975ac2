"""``danaus apply``, ``danaus kill`` and ``danaus exec``: jobs from the command line.

``apply`` applies a job object found in a Python file or module and saves it
(``.danaus/job_state.json``, JSON data); ``exec`` and ``kill`` load that saved
job (only from a file of the user's own, in a directory no one else can write),
so each is a short-lived client that reconnects to the same workers.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._job.jobs import JobTrait

from .. import _config as config

__all__ = ["add_job_commands", "run_job_command"]

# --state's default: the setting job_state_path (as JobTrait.state()'s); read when used.
STATE_HELP = "(default: the setting job_state_path, .danaus/job_state.json)"

APPLY_HELP = """\
Apply a job and leave its workers running for later clients.

JOB names a job object: FILE.py:NAME (e.g. myjob.py:job) or MODULE.NAME
(e.g. myjob.job, imported from the current directory). The job is applied
(workers started, allocation granted), attached once to check that every host
answers, and saved to --state; `danaus exec` and `danaus kill` use that file,
as does any client that calls job.state() with the same specification.

Example job file (myjob.py):

    from danaus.job import SlurmJob
    job = SlurmJob({"trainers": 2}, python_exe=".venv/bin/python")

    $ danaus apply myjob.py:job
"""

KILL_HELP = """\
Kill the job saved in --state (workers ended, allocation released) and remove the file.
"""

EXEC_HELP = """\
Run a command on the procs of the saved job; its output is shown per rank.

The first mesh of the job (or --mesh NAME) gets --per-host procs on every
host (default one per host); each runs CMD with DANAUS_RANK_<DIM> and
DANAUS_SIZE_<DIM> set for every mesh dimension (DANAUS_RANK_HOSTS,
DANAUS_RANK_GPUS, ...) and DANAUS_RANK/DANAUS_SIZE for the flat rank. The exit
code is the largest of the ranks'.

Examples:

    $ danaus exec --all -- hostname
    $ danaus exec --all --per-host gpus=2 -- sh -c 'echo $DANAUS_RANK_GPUS'
    $ danaus exec --point hosts=1 -- nvidia-smi
"""


def add_job_commands(sub: Any) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    a = sub.add_parser(
        "apply", help="apply a job and save it for later clients", description=APPLY_HELP,
        formatter_class=fmt,
    )  # fmt: skip
    a.add_argument("job", metavar="JOB", help="FILE.py:NAME or MODULE.NAME of a job object")
    a.add_argument("--state", help=f"where to save the job {STATE_HELP}")
    k = sub.add_parser(
        "kill", help="kill the saved job", description=KILL_HELP, formatter_class=fmt
    )
    k.add_argument("--state", help=f"the saved job {STATE_HELP}")
    e = sub.add_parser(
        "exec", help="run a command on the saved job's procs", description=EXEC_HELP,
        formatter_class=fmt,
    )  # fmt: skip
    target = e.add_mutually_exclusive_group()
    target.add_argument("--all", action="store_true", help="every rank")
    target.add_argument("--one", action="store_true", help="rank 0 only (the default)")
    target.add_argument(
        "--point", metavar="DIM=I[,DIM=I]", help="the ranks at these coordinates (a slice)"
    )
    e.add_argument("--mesh", metavar="NAME", help="which of the job's meshes (default: the first)")
    e.add_argument(
        "--per-host", metavar="DIM=N[,DIM=N]", help="procs per host, e.g. gpus=8 (default: 1)"
    )
    e.add_argument("--state", help=f"the saved job {STATE_HELP}")
    e.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command")


def _pairs(text: str, what: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"{what} must look like dim=N[,dim=N], got {text!r}")
        out[key.strip()] = int(value)
    return out


def _load_job_object(spec: str) -> JobTrait:
    from .._job.jobs import JobTrait

    if ":" in spec:
        path, _, name = spec.rpartition(":")
        if not os.path.isfile(path):
            raise ValueError(f"{path!r} is not a file (JOB is FILE.py:NAME or MODULE.NAME)")
        module_spec = importlib.util.spec_from_file_location("_danaus_jobfile", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        modname, _, name = spec.rpartition(".")
        if not modname:
            raise ValueError(f"JOB must be FILE.py:NAME or MODULE.NAME, got {spec!r}")
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(modname)
    job = getattr(module, name, None)
    if not isinstance(job, JobTrait):
        raise ValueError(f"{spec} is {type(job).__name__}, not a danaus job")
    return job


def _load_saved(path: str) -> JobTrait:
    from .._job.load import job_load

    try:
        return job_load(path)
    except FileNotFoundError:
        raise ValueError(f"no saved job at {path}: run `danaus apply JOB` first") from None


def _apply(args: argparse.Namespace) -> int:
    job = _load_job_object(args.job)
    state = job.state(cached_path=args.state)
    for name, mesh in state._hosts.items():
        mesh.initialized.get(timeout=config.get("exec_timeout"))
        print(f"{name}: {mesh!r} ready", flush=True)
    print(f"job saved to {args.state}; `danaus kill` ends it", flush=True)
    return 0


def _kill(args: argparse.Namespace) -> int:
    job = _load_saved(args.state)
    job._cached_path = args.state
    job.kill()
    print(f"killed the job saved in {args.state}", flush=True)
    return 0


def _exec(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ValueError("no command given: danaus exec [--all|--one|--point ...] -- CMD ...")
    per_host = _pairs(args.per_host, "--per-host") if args.per_host else None
    point = _pairs(args.point, "--point") if args.point else None
    job = _load_saved(args.state)
    state = job.state(cached_path=args.state)
    meshes = state._hosts
    name = args.mesh or next(iter(meshes))
    if name not in meshes:
        raise ValueError(f"the job has no mesh {name!r}; its meshes are {sorted(meshes)}")
    procs = meshes[name].spawn_procs(per_host=per_host)
    try:
        from .exec_actor import ExecActor

        # Spawned on the whole mesh, so every actor knows its coordinates in it.
        target: Any = procs.spawn("danaus_exec", ExecActor)
        if point is not None:
            unknown = set(point) - set(procs.sizes)
            if unknown:
                raise ValueError(
                    f"--point names {sorted(unknown)}; the dimensions are {procs.sizes}"
                )
            target = target.slice(**point)
        elif not args.all:
            target = target.slice(**dict.fromkeys(procs.sizes, 0))
        results = target.run.call(cmd, os.getcwd()).get(timeout=config.get("exec_timeout"))
        worst = 0
        for _, (label, code, out, err) in results.items():
            for stream, text in ((sys.stdout, out), (sys.stderr, err)):
                for line in text.splitlines():
                    print(f"[{label}] {line}", file=stream)
            if code != 0:
                print(f"[{label}] exited with {code}", file=sys.stderr)
            worst = max(worst, code if code >= 0 else 128 - code)
        sys.stdout.flush()
        return worst
    finally:
        procs.stop().get(timeout=60)


def run_job_command(args: argparse.Namespace) -> int:
    if args.state is None:
        args.state = str(config.get("job_state_path"))
    try:
        return {"apply": _apply, "kill": _kill, "exec": _exec}[args.command](args)
    except (ValueError, RuntimeError, TimeoutError) as e:
        print(f"danaus {args.command}: {e}", file=sys.stderr)
        return 2
