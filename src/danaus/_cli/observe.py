"""``danaus top``, ``danaus stack`` and ``danaus query``: the dashboard's view from a
terminal.

All three talk to a client's dashboard (``danaus.dashboard.serve()`` or
``DANAUS_DASHBOARD=1`` in the client) through its JSON API. Without ``--url``
they find it through the ``dashboard.json`` file the dashboard keeps in the
user's private danaus directory on this machine; if several clients serve
one, they list them and ask for ``--url``.

The token never needs to be on the command line, where every user of the
machine sees it (``ps``): with ``--url http://HOST:PORT/`` the token comes
from ``--token-file FILE`` (a file of the user's own, mode 600) or
``$DANAUS_DASHBOARD_TOKEN``. A URL that carries ``?token=`` still works, with a
warning. The token is sent in an ``Authorization`` header, not in the URL.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .. import _config as config
from .._transport.owned import read_owned

__all__ = ["add_observe_commands", "run_observe_command"]

COMMANDS = ("top", "stack", "query")
TOKEN_ENV = "DANAUS_DASHBOARD_TOKEN"
URL_HELP = (
    "the dashboard's URL, http://HOST:PORT/ (default: find it); its token comes from "
    f"--token-file or ${TOKEN_ENV}, never the command line, where `ps` shows it to all"
)
TOKEN_FILE_HELP = f"a file of yours (mode 600) holding the dashboard's token (else ${TOKEN_ENV})"


def add_observe_commands(sub: Any) -> None:
    top = sub.add_parser(
        "top",
        help="the procs and actors of a running client, refreshing (like top)",
        description="Show the host/proc/actor tree of a running danaus client with message "
        "rates, queue depths and latencies, refreshing. The client must serve its dashboard "
        "(danaus.dashboard.serve() or DANAUS_DASHBOARD=1).",
    )
    top.add_argument("--url", help=URL_HELP)
    top.add_argument("--token-file", help=TOKEN_FILE_HELP)
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--once", action="store_true", help="print once and exit")
    top.add_argument("--iterations", type=int, default=0, help="stop after N refreshes (0: never)")
    stack = sub.add_parser(
        "stack",
        help="py-spy dump of the procs of a mesh in a running client",
        description="Dump the stacks of procs of a running danaus client (py-spy; Python's own "
        "view if py-spy cannot attach). MESH is an actor mesh's name (or a proc mesh's index "
        "as `danaus top` shows it); COORDS picks procs: gpus=1,hosts=0 or positional 0,1. "
        "Example: danaus stack trainer gpus=3",
    )
    stack.add_argument("mesh", nargs="?", help="actor mesh name (or proc mesh index)")
    stack.add_argument("coords", nargs="?", default="", help="e.g. gpus=1 or 0,1 (default: all)")
    stack.add_argument("--proc", action="append", help="a proc by name (repeatable)")
    stack.add_argument("--url", help=URL_HELP)
    stack.add_argument("--token-file", help=TOKEN_FILE_HELP)
    query = sub.add_parser(
        "query",
        help="SQL over the actors, messages, spans and metrics of a running client",
        description="Run SQL over the telemetry tables (actors, messages, spans, metrics) of "
        "a running danaus client, as danaus.telemetry.query does, and print the rows as a "
        "table. The client must serve its dashboard (danaus.dashboard.serve() or "
        'DANAUS_DASHBOARD=1). Example: danaus query "SELECT endpoint, count(*) AS n FROM '
        'messages GROUP BY endpoint"',
    )
    query.add_argument("sql", help="the query")
    query.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    query.add_argument(
        "--job",
        nargs="?",
        const="",
        metavar="JOB",
        help="read the telemetry a finished job kept on this host (its telemetry.duckdb: "
        "a job started with enable_telemetry); JOB is its name, a unique prefix or its log "
        "directory (none: the latest job). Needs no dashboard (a running client holds the "
        "file: ask it without --job)",
    )
    query.add_argument("--url", help=URL_HELP)
    query.add_argument("--token-file", help=TOKEN_FILE_HELP)


def run_observe_command(args: argparse.Namespace) -> int:
    if args.command == "query" and args.job is not None:
        return _query_job(args)
    try:
        url = dashboard_url(args)
        if args.command == "top":
            return _top(url, args)
        if args.command == "query":
            return _query(url, args)
        return _stack(url, args)
    except DashboardError as e:
        print(f"danaus {args.command}: {e}", file=sys.stderr)
        return 2


class DashboardError(Exception):
    """No dashboard to talk to, or it refused or failed the request."""


def _with_token(url: str, token: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    query["token"] = token
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def dashboard_url(args: argparse.Namespace) -> str:
    """The dashboard to ask, its token in its query (kept in this process: ``api`` sends
    it in a header): ``--url`` with the token of ``--token-file``, of the URL itself or
    of ``$DANAUS_DASHBOARD_TOKEN``; else the one this user's clients serve here."""
    token = None
    if args.token_file:
        try:
            token = read_owned(args.token_file, "the token file").decode().strip()
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise DashboardError(f"cannot read the token from --token-file: {e}") from None
        if not token:
            raise DashboardError(f"the token file {args.token_file!r} is empty")
    if not args.url:
        url = find_dashboard()
        return _with_token(url, token) if token else url
    given = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(args.url).query)).get("token")
    if given:
        print(
            f"danaus {args.command}: warning: the token in --url is visible to every user of "
            f"this machine (ps); pass the URL without it and the token in ${TOKEN_ENV} or "
            "--token-file",
            file=sys.stderr,
        )
    token = token or given or os.environ.get(TOKEN_ENV) or None
    if token is None:
        raise DashboardError(
            f"--url {args.url} carries no token and none was given: put the dashboard's "
            f"token (the token= of its URL) in ${TOKEN_ENV}, or in a file only you can "
            "read named by --token-file"
        )
    return _with_token(args.url, token)


def find_dashboard() -> str:
    """The URL of the one dashboard served on this machine by this user's clients."""
    # Here, not at the top: `danaus worker` must not load the actor core before its set-up.
    from .._observe.dashboard import DISCOVERY_FILE
    from .._transport.address import socket_bases

    found = []
    paths = (glob.glob(os.path.join(base, "*", DISCOVERY_FILE)) for base in socket_bases())
    for path in sorted(p for some in paths for p in some):
        try:
            with open(path) as f:
                info = json.load(f)
            os.kill(int(info["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # gone, or not ours to read
        found.append(info)
    if not found:
        raise DashboardError(
            "no running danaus client serves a dashboard on this machine; start one in the "
            "client with danaus.dashboard.serve() (or DANAUS_DASHBOARD=1), or pass --url"
        )
    if len(found) > 1:
        listed = "\n  ".join(f"pid {i['pid']}: {i['url']}" for i in found)
        raise DashboardError(f"several clients serve a dashboard; pick one with --url:\n  {listed}")
    return str(found[0]["url"])


def api(url: str, path: str, params: dict[str, Any] | None = None, timeout: float = 60.0) -> Any:
    """GET ``path`` of the dashboard at ``url`` (which carries the token, sent in an
    ``Authorization`` header rather than the request's URL); the JSON answer."""
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    token = query.pop("token", "")
    query.update({k: v for k, v in (params or {}).items() if v is not None})
    target = urllib.parse.urlunsplit(
        (parts.scheme, parts.netloc, path, urllib.parse.urlencode(query, doseq=True), "")
    )
    request = urllib.request.Request(target, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        try:
            body = json.loads(body).get("error", body)
        except ValueError:
            pass
        raise DashboardError(f"the dashboard answered {e.code}: {body.strip()}") from None
    except (urllib.error.URLError, OSError) as e:
        raise DashboardError(f"cannot reach the dashboard at {parts.netloc}: {e}") from None


# -- danaus stack -----------------------------------------------------------------------


def _stack(url: str, args: argparse.Namespace) -> int:
    if not args.mesh and not args.proc:
        raise DashboardError("say which procs: danaus stack MESH [COORDS], or --proc NAME")
    params: dict[str, Any] = {"proc": args.proc} if args.proc else {}
    if args.mesh:
        params.update(mesh=args.mesh, coords=args.coords or None)
    answer = api(url, "/api/stack", params, timeout=config.get("stack_timeout") + 30)
    failed = 0
    for d in answer["dumps"]:
        print(f"=== proc {d['proc']} ===")
        print(d["dump"].rstrip("\n"))
        print()
        failed += not d["ok"]
    return 1 if failed else 0


# -- danaus query -----------------------------------------------------------------------


def _query(url: str, args: argparse.Namespace) -> int:
    answer = api(url, "/api/query", {"sql": args.sql})
    columns, rows = answer["columns"], answer["rows"]
    if args.json:
        for r in rows:
            print(json.dumps(dict(zip(columns, r, strict=True)), default=str))
        return 0
    print(text_table(columns, rows))
    return 0


def _query_job(args: argparse.Namespace) -> int:
    """``danaus query --job``: the SQL over a job's kept telemetry, on this host."""
    from .._observe import history, sql
    from .._runtime.logs import dirs as logdir

    try:
        directory = logdir.find_job(args.job or None)
    except FileNotFoundError as e:
        print(f"danaus query: {e}", file=sys.stderr)
        return 2
    path = os.path.join(directory, history.FILE)
    if not os.path.exists(path):
        print(
            f"danaus query: job {os.path.basename(directory)} kept no telemetry ({path} does "
            "not exist): a job keeps it when started with job.enable_telemetry(...)",
            file=sys.stderr,
        )
        return 2
    try:
        columns, rows = sql.query_file(path, args.sql)
    except (sql.QueryError, ImportError) as e:
        print(f"danaus query: {e}", file=sys.stderr)
        return 2
    if args.json:
        for r in rows:
            print(json.dumps(dict(zip(columns, r, strict=True)), default=str))
        return 0
    print(text_table(columns, [list(r) for r in rows]))
    return 0


def _cell(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def text_table(columns: list[str], rows: list[list[Any]]) -> str:
    """Rows under their column names, aligned (numbers to the right); "(no rows)" if none."""
    if not rows:
        return "(no rows)"
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    right = [all(isinstance(r[i], (int, float)) or r[i] is None for r in rows)
             for i in range(len(columns))]  # fmt: skip

    def line(vals: list[str]) -> str:
        return "  ".join(
            v.rjust(w) if r else v.ljust(w) for v, w, r in zip(vals, widths, right, strict=True)
        ).rstrip()

    out = [line(list(columns)), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


# -- danaus top -------------------------------------------------------------------------


def _dur(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f}us"
    if s < 1:
        return f"{s * 1e3:.1f}ms"
    return f"{s:.2f}s"


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


COLUMNS = ["proc", "state", "actor", "class", "msgs", "msgs/s", "queued", "calls", "errors",
           "p50", "p99"]  # fmt: skip


def rows(state: dict[str, Any]) -> list[list[str]]:
    """One row per actor (and one per proc without actors), grouped by host."""
    out = []
    for h in state["hosts"]:
        for p in h["procs"]:
            name = f"{p['proc']} {{{','.join(f'{k}={v}' for k, v in p['coords'].items())}}}"
            if p.get("parent"):  # spawned by an actor on proc `parent`
                name = f"  {name} in {p['parent']}"
            if not p["actors"]:
                out.append([name, p["state"], "-", "-", "", "", "", "", "", "", ""])
            for a in p["actors"]:
                eps = a["endpoints"].values()
                p50 = max((e["p50_s"] or 0 for e in eps), default=None)
                p99 = max((e["p99_s"] or 0 for e in eps), default=None)
                out.append(
                    [
                        name,
                        p["state"],
                        a["actor"],
                        a["class"] or "-",
                        str(a["received"]),
                        _num(a["rate"]),
                        str(a["queued"]),
                        str(sum(e["calls"] for e in eps)),
                        str(sum(e["errors"] for e in eps)),
                        _dur(p50 if eps else None),
                        _dur(p99 if eps else None),
                    ]
                )
    return out


def headline(state: dict[str, Any]) -> str:
    t = state["totals"]
    return (
        f"danaus top - client {state['client']['proc']} (pid {state['client']['pid']}) - "
        f"{t['procs']} procs ({t['alive']} alive), {t['actors']} actors, {t['calls']} calls, "
        f"{t['errors']} errors, {t['rate']:.1f} calls/s"
    )


def plain(state: dict[str, Any]) -> str:
    """The table as plain text (``--once``, or without rich)."""
    table = [COLUMNS, *rows(state)]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    lines = [headline(state), ""]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    for f in state["failures"]:
        lines.append(f"FAILED {f['actor']} on proc {f['proc']}: {f['reason']}")
    lines += [restart_line(r) for r in state.get("restarts", [])]
    return "\n".join(lines)


def restart_line(r: dict[str, Any]) -> str:
    """One restart a supervisor made, as ``danaus top`` shows it."""
    when = time.strftime("%H:%M:%S", time.localtime(r["time"]))
    return (
        f"RESTARTED {r['child']}{r['ranks']} by supervisor {r['supervisor']!r} at {when}: "
        f"{r['reason']}"
    )


def _rich_table(state: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=headline(state), title_justify="left", expand=False)
    numeric = {"msgs", "msgs/s", "queued", "calls", "errors", "p50", "p99"}
    for c in COLUMNS:
        table.add_column(c, justify="right" if c in numeric else "left")
    colour = {"alive": "green", "dead": "red", "not answering": "yellow"}
    for r in rows(state):
        r = list(r)
        r[1] = f"[{colour.get(r[1], 'white')}]{r[1]}[/]"
        table.add_row(*r)
    fails = [Text(f"FAILED {f['actor']} on proc {f['proc']}: {f['reason']}", style="red")
             for f in state["failures"]]  # fmt: skip
    fails += [Text(restart_line(r), style="yellow") for r in state.get("restarts", [])]
    return Group(table, *fails)


def _top(url: str, args: argparse.Namespace) -> int:
    if args.once:
        print(plain(api(url, "/api/state")))
        return 0
    try:
        from rich.live import Live
    except ImportError:
        print("(install rich for a live view: pip install 'danaus[dashboard]')", file=sys.stderr)
        return _top_plain(url, args)
    try:
        with Live(_rich_table(api(url, "/api/state")), auto_refresh=False) as live:
            n = 1
            while not (args.iterations and n >= args.iterations):
                time.sleep(args.interval)
                live.update(_rich_table(api(url, "/api/state")), refresh=True)
                n += 1
    except KeyboardInterrupt:
        pass
    return 0


def _top_plain(url: str, args: argparse.Namespace) -> int:
    n = 0
    try:
        while True:
            print(plain(api(url, "/api/state")), flush=True)
            n += 1
            if args.iterations and n >= args.iterations:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
