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


def _dashboard(args: argparse.Namespace) -> None:
    if getattr(args, "dashboard_cmd", None) is None:
        args._dashboard_subparser.print_help()
        return
    print(
        "Error: `dashboard mast` relays the dashboard of a job on Meta's internal scheduler "
        "(MAST), which danaus does not have. danaus's own dashboard: danaus.dashboard.serve() "
        "in the program (or the setting dashboard=True), and `danaus top` in a terminal.",
        file=sys.stderr,
    )
    sys.exit(1)


def _add_dashboard(subparsers: Any) -> None:
    """Monarch's ``dashboard`` command: its one subcommand, ``mast``, parses as Monarch's
    and, as in Monarch's open-source build, refuses to run (MAST is Meta's)."""
    dash = subparsers.add_parser("dashboard", help="Serve Monarch dashboards (MAST: not in danaus)")
    dash.set_defaults(_dashboard_subparser=dash, func=_dashboard)
    sub = dash.add_subparsers(title="DASHBOARD COMMANDS", dest="dashboard_cmd")
    mast = sub.add_parser("mast", help="Relay a MAST job's dashboard (Meta-internal; refused)")
    mast.add_argument("job", help="the MAST job name")
    mast.add_argument("--role-name", default=None, help="the role that hosts the dashboard")
    mast.add_argument(
        "--dashboard-port", type=int, default=8265, help="the dashboard's port (8265)"
    )


def get_parser() -> argparse.ArgumentParser:
    """The ``danaus`` command's parser, each subcommand with Monarch's ``func``; with
    Monarch's ``dashboard mast`` too, which parses and then refuses (MAST is Meta's)."""
    parser = build_parser()
    funcs: dict[str, Any] = {"apply": _apply, "exec": _exec, "shell": _shell}
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        subparsers: dict[str, argparse.ArgumentParser] = dict(action.choices or {})
        for name, sub in subparsers.items():
            sub.set_defaults(func=funcs.get(name, lambda args: _exit(_run(args))))
        if "dashboard" not in subparsers and hasattr(action, "add_parser"):
            _add_dashboard(action)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run the ``danaus`` command with ``argv`` (default: this process's); exits with its
    code when that is not 0, as Monarch's ``main``."""
    args = get_parser().parse_args(sys.argv[1:] if argv is None else argv)
    args.func(args)
