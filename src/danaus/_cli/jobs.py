"""``danaus apply``, ``exec``, ``shell``, ``kill`` and ``context``: jobs from the command line.

``apply`` applies a job object found in a Python file or module and saves it
(``.danaus/job_state.json``, JSON data, or the active context's); ``exec``,
``shell`` and ``kill`` load that saved job (only from a file of the user's own,
in a directory no one else can write), so each is a short-lived client that
reconnects to the same workers. ``context`` keeps several jobs apart.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._job import commands, current
from .._job.execute import parse_env

__all__ = ["JOB_COMMANDS", "add_job_commands", "run_job_command"]

JOB_COMMANDS = ("apply", "kill", "exec", "shell", "context")

# --state's default: as JobTrait.state()'s, read when used.
STATE_HELP = "(default: the setting job_state_path, .danaus/job_state.json, or the context's)"

APPLY_HELP = """\
Apply a job and leave its workers running for later clients.

JOB names a job object: FILE.py:NAME (e.g. myjob.py:job) or MODULE.NAME
(e.g. myjob.job, imported from the current directory); it is recorded as the
active context's job, so a later `danaus apply` without JOB applies it again.
The job is applied (workers started, allocation granted), attached once to
check that every host answers, and saved to --state; `danaus exec`, `shell`
and `kill` use that file, as does any client that calls job.state() with the
same specification.

Example job file (myjob.py):

    from danaus.job import SlurmJob
    job = SlurmJob({"trainers": 2}, python_exe=".venv/bin/python")

    $ danaus apply myjob.py:job
"""

KILL_HELP = """\
Kill the job saved in --state, or in context NAME (workers ended, allocation
released) and remove the file.
"""

EXEC_HELP = """\
Run a command on the procs of the saved job; its output is shown per rank.

The first mesh of the job (or --mesh NAME; with --all and no --mesh, every
mesh in turn, as Monarch's, each line prefixed by the mesh's name) gets --per-host procs on every
host (default one per host); each runs CMD with DANAUS_RANK_<DIM> and
DANAUS_SIZE_<DIM> set for every mesh dimension (DANAUS_RANK_HOSTS,
DANAUS_RANK_GPUS, ...), DANAUS_RANK/DANAUS_SIZE for the flat rank, and
Monarch's MONARCH_RANK_<dim>/MONARCH_SIZE_<dim> (the label as it is:
MONARCH_RANK_hosts). The exit code is the largest of the ranks'.

Examples:

    $ danaus exec --all -- hostname
    $ danaus exec --all --per-host gpus=2 -- sh -c 'echo $DANAUS_RANK_GPUS'
    $ danaus exec --point hosts=1 -e LOG=debug --workdir /data -- nvidia-smi
    $ danaus exec --all --script setup.sh        # or --script - to read it from stdin
    $ danaus exec --kill -- python train.py      # then end the job
"""

SHELL_HELP = """\
Open a shell on one host of the saved job: the first mesh's first host, or
--mesh NAME / --point hosts=1. The shell is the worker's $SHELL (default
/bin/bash), with the rank variables of `danaus exec`. With a terminal on
stdin it is interactive on a pseudo-terminal; otherwise it reads its commands
from stdin. The exit code is the shell's.

Examples:

    $ danaus shell --point hosts=1
    $ echo 'hostname; exit 3' | danaus shell -e DEBUG=1 --workdir /tmp
"""

CONTEXT_HELP = """\
Keep several jobs in one directory, one per context. `danaus apply`, `exec`,
`shell` and `kill` use the active context's job (.danaus/job_state.json for
'default', .danaus/contexts/NAME/job_state.json for another).

Examples:

    $ danaus context create eval
    $ danaus context use eval && danaus apply evaljob.py:job
    $ danaus context ls                 # '* ' marks the active context
    $ danaus context rm eval            # kills its job
"""


def add_job_commands(sub: Any) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    a = sub.add_parser(
        "apply", help="apply a job and save it for later clients", description=APPLY_HELP,
        formatter_class=fmt,
    )  # fmt: skip
    a.add_argument(
        "module_path", metavar="JOB", nargs="?",
        help="FILE.py:NAME or MODULE.NAME of a job object (default: the context's job)",
    )  # fmt: skip
    a.add_argument("--state", help=f"where to save the job {STATE_HELP}")
    k = sub.add_parser(
        "kill", help="kill the saved job", description=KILL_HELP, formatter_class=fmt
    )
    k.add_argument("name", metavar="NAME", nargs="?", help="a context (default: the active one)")
    k.add_argument("--state", help=f"the saved job {STATE_HELP}")
    e = sub.add_parser(
        "exec", help="run a command on the saved job's procs", description=EXEC_HELP,
        formatter_class=fmt,
    )  # fmt: skip
    target = e.add_mutually_exclusive_group()
    target.add_argument(
        "--all", dest="run_all", action=_NotWith, nargs=0, default=False, other="mesh",
        help="every rank of every mesh",
    )  # fmt: skip
    target.add_argument("--one", action="store_true", help="rank 0 only (the default)")
    target.add_argument(
        "--point", metavar="DIM=I[,DIM=I]", help="the ranks at these coordinates (a slice)"
    )
    e.add_argument(
        "--mesh", metavar="NAME", action=_NotWith, other="run_all",
        help="every rank of this mesh (with --one or --point: those ranks of it); not with --all",
    )  # fmt: skip
    e.add_argument(
        "--per-host", metavar="DIM=N[,DIM=N]", help="procs per host, e.g. gpus=8 (default: 1)"
    )
    _add_env_workdir_kill(e, "the command")
    e.add_argument(
        "--script", metavar="FILE",
        help="run this bash script instead of a command ('-': read it from stdin)",
    )  # fmt: skip
    e.add_argument("--state", help=f"the saved job {STATE_HELP}")
    e.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command")
    s = sub.add_parser(
        "shell", help="open a shell on one host of the saved job", description=SHELL_HELP,
        formatter_class=fmt,
    )  # fmt: skip
    s.add_argument("--mesh", metavar="NAME", help="which of the job's meshes (default: the first)")
    s.add_argument("--point", metavar="DIM=I[,DIM=I]", help="the host (default: the first)")
    _add_env_workdir_kill(s, "the shell")
    s.add_argument("--state", help=f"the saved job {STATE_HELP}")
    c = sub.add_parser(
        "context", help="manage job contexts (create, use, rm, ls)", description=CONTEXT_HELP,
        formatter_class=fmt,
    )  # fmt: skip
    csub = c.add_subparsers(dest="context_command", required=True, metavar="{create,use,rm,ls}")
    for verb, what in (
        ("create", "create a context"),
        ("use", "make a context the active one (created if missing)"),
        ("rm", "remove a context, killing its job"),
    ):
        csub.add_parser(verb, help=what).add_argument("name", metavar="NAME")
    csub.add_parser("ls", help="list the contexts; '* ' marks the active one")


class _NotWith(argparse.Action):
    """An option that cannot go with option ``other`` (a dest), in either order, as
    Monarch's ``exec`` refuses ``--all`` with ``--mesh``; a flag when ``nargs=0``."""

    def __init__(self, *args: Any, other: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.other = other

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        if getattr(namespace, self.other, None):
            parser.error("--all and --mesh cannot go together (--mesh NAME alone: every rank)")
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def _add_env_workdir_kill(p: Any, what: str) -> None:
    p.add_argument(
        "-e", "--env", action="append", default=[], metavar="KEY=VALUE",
        help=f"add to {what}'s environment (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--workdir", metavar="DIR",
        help=f"where {what} runs (default: this directory, where the host has it)",
    )  # fmt: skip
    p.add_argument("--kill", action="store_true", help=f"kill the job after {what} ends")


def _pairs(text: str, what: str) -> dict[str, int]:
    return commands.parse_point(text, what)


def _apply(args: argparse.Namespace) -> int:
    if args.module_path is None and args.state is None:
        try:
            current.load_current_job()  # says what to do when the context has no job
        except FileNotFoundError as e:
            raise ValueError(str(e)) from None
    commands.apply_job(args.module_path, args.state)
    print("`danaus kill` ends it", flush=True)
    return 0


def _kill(args: argparse.Namespace) -> int:
    path = args.state
    if args.name is not None:
        if args.state is not None:
            raise ValueError("give a context NAME or --state, not both")
        path = current.context_state_path(args.name)
    elif path is None:
        path = current.current_job_path()
    commands.load_saved(path).kill()
    print(f"killed the job saved in {path}", flush=True)
    return 0


def _exec(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if args.script is not None:
        if cmd:
            raise ValueError("give a command or --script, not both")
        text = sys.stdin.read() if args.script == "-" else _read(args.script)
        cmd = ["bash", "-c", text]
    return commands.run_exec(
        args.state or current.current_job_path(),
        cmd,
        # As Monarch's: --mesh alone is every rank of that mesh; with --one or --point, less.
        target="all" if args.run_all or (args.mesh and not args.one and not args.point) else "one",
        mesh_name=args.mesh,
        point=_pairs(args.point, "--point") if args.point else None,
        per_host=_pairs(args.per_host, "--per-host") if args.per_host else None,
        env=parse_env(args.env),
        workdir=args.workdir,
        kill=args.kill,
    )


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read the script {path!r}: {e.strerror}") from None


def _shell(args: argparse.Namespace) -> int:
    return commands.run_shell(
        args.state or current.current_job_path(),
        mesh_name=args.mesh,
        point=_pairs(args.point, "--point") if args.point else None,
        env=parse_env(args.env),
        workdir=args.workdir,
        kill=args.kill,
    )


def _context(args: argparse.Namespace) -> int:
    verb = args.context_command
    if verb == "ls":
        commands.context_ls()
    elif verb == "create":
        commands.context_create(args.name)
    elif verb == "use":
        commands.context_use(args.name)
    else:
        error = current.context_rm(args.name)
        print(f"Removed context '{args.name}'")
        if error is not None:
            print(f"danaus context rm: its job could not be killed: {error}", file=sys.stderr)
            return 1
    return 0


def run_job_command(args: argparse.Namespace) -> int:
    run = {"apply": _apply, "kill": _kill, "exec": _exec, "shell": _shell, "context": _context}
    try:
        return run[args.command](args)
    except (ValueError, RuntimeError, TimeoutError) as e:
        print(f"danaus {args.command}: {e}", file=sys.stderr)
        return 2
