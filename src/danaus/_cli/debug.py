"""``danaus debug``: the prompt of a running client's debugger, in another terminal.

A client starts its debug controller the first time one of its actors calls
``breakpoint()``; the controller listens on ``debug.sock`` in the client's job
directory (``$TMPDIR/danaus-$UID/<job>/``, mode 0700) and writes
``debug.json`` (pid, command line, socket) beside it. ``danaus debug`` finds the
live ones there; with several it asks for ``--pid``. It then relays the
prompt: lines typed here go to the controller, its output is printed here.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import socket
import sys
from typing import Any

__all__ = ["add_debug_command", "find_clients", "run_debug"]

DEBUG_HELP = """\
Debug the actors of a running danaus client that are paused in breakpoint().

Commands at the danaus_dbg> prompt: list, attach <actor> <rank>,
cast <actor> ranks(SEL) <pdb command>, continue, help, quit ('detach' inside an
attached pdb session returns to the prompt). With one client running on this
machine, `danaus debug` finds it; with several, name it with --pid.

Examples:

    $ danaus debug
    danaus_dbg> list
    danaus_dbg> attach trainer 0
    (Pdb) p loss
    (Pdb) detach
    danaus_dbg> cast trainer ranks(gpus=0:4) n
    danaus_dbg> continue
"""


def add_debug_command(sub: Any) -> None:
    d = sub.add_parser(
        "debug",
        help="debug actors paused in breakpoint() (list, attach, cast, continue)",
        description=DEBUG_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("--pid", type=int, help="the client's process id, when several are running")
    d.add_argument("--socket", help="the debug socket itself (debug.sock in the job directory)")


def find_clients() -> list[dict[str, Any]]:
    """The running clients of this user whose debugger is up: ``{"pid", "argv", "socket"}``."""
    from .._transport.address import socket_bases

    found = []
    paths = (glob.glob(os.path.join(base, "*", "debug.json")) for base in socket_bases())
    for path in sorted(p for some in paths for p in some):
        try:
            with open(path) as f:
                info = json.load(f)
            pid = int(info["pid"])
            os.kill(pid, 0)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a client that exited, or a file half written
        if os.path.exists(info.get("socket", "")):
            found.append(info)
    return found


def _choose(args: argparse.Namespace) -> str | None:
    if args.socket:
        return str(args.socket)
    clients = find_clients()
    if args.pid is not None:
        clients = [c for c in clients if c["pid"] == args.pid]
        if not clients:
            print(
                f"danaus debug: client pid {args.pid} has no debugger running (it starts when "
                "one of its actors first calls breakpoint())",
                file=sys.stderr,
            )
            return None
    if not clients:
        print(
            "danaus debug: no running danaus client has a paused actor (a client starts its "
            "debugger when one of its actors first calls breakpoint())",
            file=sys.stderr,
        )
        return None
    if len(clients) > 1:
        print("danaus debug: several clients are running; choose one with --pid:", file=sys.stderr)
        for c in clients:
            print(f"  --pid {c['pid']}  {' '.join(c.get('argv', []))}", file=sys.stderr)
        return None
    return str(clients[0]["socket"])


def run_debug(args: argparse.Namespace) -> int:
    path = _choose(args)
    if path is None:
        return 2
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as e:
        print(f"danaus debug: cannot connect to {path}: {e}", file=sys.stderr)
        return 2
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    stream = sock.makefile("rwb")
    try:
        return _relay(stream)
    except KeyboardInterrupt:
        print("\ndanaus debug: interrupted; the sessions stay paused", file=sys.stderr)
        return 130
    finally:
        with contextlib.suppress(OSError):  # a line the gone client never read
            stream.close()
        sock.close()


def _relay(stream: Any) -> int:
    for raw in stream:
        msg = json.loads(raw)
        if "o" in msg:
            sys.stdout.write(msg["o"])
            sys.stdout.flush()
        elif "p" in msg:
            try:
                line = input(msg["p"])
            except EOFError:  # Ctrl-D: leave like 'quit'
                print()
                line = "quit"
            try:
                stream.write(json.dumps({"i": line}).encode() + b"\n")
                stream.flush()
            except OSError:  # the client went away: its last words may still be to read
                pass
        elif "bye" in msg:
            print(msg["bye"])
            return 0
    print("danaus debug: the client went away", file=sys.stderr)
    return 1
