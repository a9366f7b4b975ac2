"""``danaus``: the command line (``danaus worker --listen tcp://0.0.0.0:26600``)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["build_parser", "main", "run"]


def _worker(args: argparse.Namespace) -> int:
    import os

    secret = None
    if args.secret_file == "-":  # the secret arrives on stdin, never on a command line
        secret = sys.stdin.readline().strip()
        if not secret:
            print("danaus worker: --secret-file - but stdin held no secret", file=sys.stderr)
            return 2
        args.secret_file = None  # kept in memory only: never in an environment
    for flag, var in (("tls_cert", "CERT"), ("tls_key", "KEY"), ("tls_ca", "CA")):
        if getattr(args, flag):
            os.environ[f"DANAUS_TLS_{var}"] = getattr(args, flag)  # procs inherit it
    import danaus.actor  # noqa: F401  (the zygote preloads the actor layer)
    from danaus._runtime.hosting.worker import plan_worker, print_warnings, serve_worker

    def listening(addr: str) -> None:
        print(f"danaus worker listening on {addr}", flush=True)

    try:  # checked here, so that refusals and warnings reach the terminal even with --detach
        plan = plan_worker(
            address=args.listen,
            secret=secret,
            secret_file=args.secret_file,
            insecure=args.insecure,
        )
    except (ValueError, RuntimeError) as e:
        print(f"danaus worker: {e}", file=sys.stderr)
        return 2
    if args.detach:
        from danaus._job.detach import run_detached

        print_warnings(plan)  # on the terminal; the detached worker repeats them in its log
        return run_detached(lambda on_listening: serve_worker(plan, on_listening), args.log_file)
    try:
        serve_worker(plan, listening)
    except (ValueError, RuntimeError) as e:
        print(f"danaus worker: {e}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``danaus`` command's parser, every subcommand added."""
    from .debug import add_debug_command
    from .jobs import add_job_commands
    from .logs import add_logs_command
    from .observe import add_observe_commands

    parser = argparse.ArgumentParser(
        prog="danaus",
        description="danaus command line: serve hosts (worker), manage jobs (apply, exec, "
        "shell, kill, context), read the procs' output (logs).",
        epilog="`danaus COMMAND --help` explains each command with examples.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="serve this machine as a worker host for danaus clients")
    w.add_argument("--listen", required=True, help="tcp://HOST:PORT to listen on (port 0: any)")
    w.add_argument(
        "--secret-file",
        help="file holding the job secret, '-' to read it from stdin (else $DANAUS_SECRET)",
    )
    w.add_argument(
        "--detach",
        action="store_true",
        help="run the worker in the background (own session); print its address and pid "
        "once it listens, then exit (how SSHJob starts workers)",
    )
    w.add_argument("--log-file", help="with --detach: the worker's output (default: a temp file)")
    w.add_argument(
        "--insecure",
        action="store_true",
        help="listen without a job secret (anyone who reaches the port can run code; prints a "
        "warning to stderr, before detaching with --detach); clients then need "
        "DANAUS_INSECURE=1",
    )
    w.add_argument("--tls-cert", help="PEM certificate: makes TCP connections mutual TLS")
    w.add_argument("--tls-key", help="PEM private key of --tls-cert")
    w.add_argument("--tls-ca", help="PEM CA that peers' certificates must chain to")
    add_job_commands(sub)
    add_debug_command(sub)
    add_logs_command(sub)
    add_observe_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``danaus`` command with ``argv`` (default: this process's); its exit code."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the subcommand ``args`` were parsed for; its exit code."""
    from .debug import run_debug
    from .jobs import JOB_COMMANDS, run_job_command
    from .logs import run_logs_command
    from .observe import COMMANDS as OBSERVE_COMMANDS
    from .observe import run_observe_command

    if args.command == "worker":
        return _worker(args)
    if args.command in JOB_COMMANDS:
        return run_job_command(args)
    if args.command == "debug":
        return run_debug(args)
    if args.command == "logs":
        return run_logs_command(args)
    if args.command in OBSERVE_COMMANDS:
        return run_observe_command(args)
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
