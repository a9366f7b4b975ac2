"""``danaus.tools.cli``: Monarch's ``monarch.tools.cli`` entry point, the ``danaus``
command (``apply``, ``exec``, ``shell``, ``kill``, ``context``, ...).

``get_parser()`` parses as Monarch's does (``args.module_path`` for ``apply``,
``args.run_all`` for ``exec --all``, ``--all`` refused with ``--mesh``) and gives
each subcommand Monarch's ``args.func(args)``; ``apply``, ``exec`` and ``shell`` run
through this module's ``apply_job``, ``exec_on_job`` and ``shell_on_job``, as
Monarch's do. A non-zero exit code ends the process (``SystemExit``).

Example:

    from danaus.tools.cli import main

    main(["context", "ls"])
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._cli.main import build_parser
from .._cli.main import run as _run
from .commands import apply_job, exec_on_job, shell_on_job

__all__ = ["apply_job", "exec_on_job", "get_parser", "main", "shell_on_job"]


def _exit(code: int | None) -> None:
    if code:
        sys.exit(code)


def _apply(args: argparse.Namespace) -> None:
    if args.module_path is None or args.state is not None:
        _exit(_run(args))  # danaus's: the context's job, --state
        return
    apply_job(args.module_path)


def _exec(args: argparse.Namespace) -> None:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if args.state is not None or (args.one and args.mesh):  # danaus's own options
        _exit(_run(args))
        return
    per_host = None
    if args.per_host:
        per_host = {k: int(v) for k, v in (p.split("=", 1) for p in args.per_host.split(","))}
    _exit(
        exec_on_job(
            cmd,
            run_all=args.run_all,
            mesh_name=args.mesh,
            point_str=args.point,
            env=args.env or None,
            workdir=args.workdir,
            kill=args.kill,
            script=args.script,
            per_host=per_host,
        )
    )


def _shell(args: argparse.Namespace) -> None:
    if args.state is not None:
        _exit(_run(args))
        return
    _exit(
        shell_on_job(
            mesh_name=args.mesh,
            point_str=args.point,
            env=args.env or None,
            workdir=args.workdir,
            kill=args.kill,
        )
    )


def get_parser() -> argparse.ArgumentParser:
    """The ``danaus`` command's parser, each subcommand with Monarch's ``func``."""
    parser = build_parser()
    funcs: dict[str, Any] = {"apply": _apply, "exec": _exec, "shell": _shell}
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        subparsers: dict[str, argparse.ArgumentParser] = dict(action.choices or {})
        for name, sub in subparsers.items():
            sub.set_defaults(func=funcs.get(name, lambda args: _exit(_run(args))))
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run the ``danaus`` command with ``argv`` (default: this process's); exits with its
    code when that is not 0, as Monarch's ``main``."""
    args = get_parser().parse_args(sys.argv[1:] if argv is None else argv)
    args.func(args)
