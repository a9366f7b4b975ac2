"""The log search page's data: ``GET /api/ui/logs``, the lines of every proc, filtered.

Parameters (all optional): ``q`` (a substring, case-insensitive), ``mesh`` (an actor
mesh's or a proc mesh's name), ``rank`` (the rank in that mesh), ``level`` (``DEBUG``,
``INFO``, ``WARNING``, ``ERROR`` or ``CRITICAL``: that level and above), ``proc`` (one
proc's name), ``limit`` (lines at most, default 500, the newest kept).

Where the lines come from: the log files of this host's procs (``<log dir>/<job>/
<proc>.log``, complete; the last ``READ_BYTES`` of each are searched) and, for procs
of other hosts, the lines this client received (``logtail``). A line's level is that
of a Python ``logging`` record (``LEVEL logger: message``, as procs format them); the
indented lines and the ``Traceback`` that follow a record are its own; ``print``
output has none, so a level filter leaves it out.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from ..._runtime.logs import dirs as logdir
from ..._runtime.node import Node
from .. import logtail
from ..web import Route, blocking
from .common import BadRequest, json_route, number, table

__all__ = ["LEVELS", "Source", "routes", "search"]

READ_BYTES = 8 << 20  # of each log file, its end
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_RECORD = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+: ")


@dataclass
class Source:
    """One proc's lines: its name, mesh label and coordinates, and where they are."""

    proc: str
    label: str
    coords: dict[str, int]
    host: str
    path: str | None  # its log file on this host; None: the client's tail
    rank: int | None = None  # its rank in its proc mesh


def routes(dash: Any) -> dict[str, Route]:
    async def get(request: Any) -> Any:
        level = request.query.get("level", "").upper() or None
        if level is not None and level not in LEVELS:
            raise BadRequest(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
        rank = request.query.get("rank", "")
        if rank and not rank.isdigit():
            raise BadRequest(f"rank must be a whole number, got {rank!r}")
        limit = int(number(request, "limit", 500, 1, 5000))
        state = await blocking(dash.state)
        procs = [p["proc"] for h in state.get("hosts", []) for p in h["procs"]]
        return await blocking(
            search,
            dash.node,
            request.query.get("q", ""),
            request.query.get("mesh") or None,
            int(rank) if rank else None,
            level,
            request.query.get("proc") or None,
            limit,
            procs,
        )

    return {"/api/ui/logs": json_route(get)}


def sources(node: Node, procs: list[str]) -> list[Source]:
    """Every proc with lines: those with a log file in this job's directory on this host,
    then ``procs`` (the client's tree) that have none here, read from the client's tail."""
    job = os.path.join(logdir.base_dir(), node.runtime.proc_id.name)
    out: list[Source] = []
    if os.path.isdir(job):
        for p in logdir.read_procs(job):
            try:
                coords = logdir.parse_coords(p.coords)
            except ValueError:
                coords = {}
            out.append(Source(p.proc, p.label, coords, p.host, p.path))
    _ranks(out)
    have = {s.proc for s in out}
    for name in [*procs, *logtail.procs(node)]:
        if name not in have:
            have.add(name)
            out.append(Source(name, "", {}, "", None))
    return out


def _ranks(found: list[Source]) -> None:
    """Each proc's rank in its proc mesh: row-major over the coordinates of the procs of
    the same label (the sizes are one more than the largest index seen)."""
    by: dict[str, list[Source]] = {}
    for s in found:
        by.setdefault(s.label, []).append(s)
    for members in by.values():
        dims = list(members[0].coords)
        if not all(list(s.coords) == dims for s in members):
            continue
        sizes = [max(s.coords[d] for s in members) + 1 for d in dims]
        for s in members:
            index = 0
            for d, size in zip(dims, sizes, strict=True):
                index = index * size + s.coords[d]
            s.rank = index
    # Procs of several proc meshes with one label (spawned again): ranks are ambiguous.
    for members in by.values():
        if len({s.rank for s in members}) < len(members):
            for s in members:
                s.rank = None


def _lines(node: Node, src: Source) -> tuple[list[str], bool]:
    """The source's lines (its file's last READ_BYTES), and whether the start was cut."""
    if src.path is None:
        return [x["line"] for x in logtail.tail(node, src.proc)], False
    try:
        with open(src.path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - READ_BYTES))
            data = f.read(READ_BYTES)
    except OSError:
        return [], False
    cut = size > READ_BYTES
    text = data.decode("utf-8", "replace")
    if cut:
        text = text.split("\n", 1)[-1]  # a partial first line
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines, cut


def levels(lines: list[str]) -> list[str | None]:
    """Each line's level: its record's, or that of the record it continues (indented
    lines, a ``Traceback``, and the ``SomeError: ...`` line that ends it), or None."""
    out: list[str | None] = []
    current: str | None = None
    in_traceback = False  # the current record has printed "Traceback ..."
    for line in lines:
        m = _RECORD.match(line)
        if m:
            current, in_traceback = m.group(1), False
        elif current is not None and line.startswith("Traceback"):
            in_traceback = True
        elif current is not None and line[:1].isspace():
            pass  # the record goes on
        elif current is not None and in_traceback and _ends_traceback(line):
            out.append(current)  # the exception's line ends the record
            current, in_traceback = None, False
            continue
        else:
            current, in_traceback = None, False  # print output
        out.append(current)
    return out


def _ends_traceback(line: str) -> bool:
    head = line.split(":", 1)[0]
    return bool(head) and " " not in head and (head.endswith("Error") or
                                               head.endswith("Exception"))  # fmt: skip


def search(
    node: Node,
    q: str,
    mesh: str | None,
    rank: int | None,
    level: str | None,
    proc: str | None,
    limit: int,
    procs: list[str],
) -> dict[str, Any]:
    """The lines that match (see the module's docstring), the newest ``limit``."""
    found = sources(node, procs)
    wanted = _procs_of(node, mesh, rank, found) if mesh is not None or rank is not None else None
    needle = q.lower()
    floor = LEVELS.index(level) if level else -1
    matched: list[dict[str, Any]] = []
    searched = []
    total = 0
    for src in found:
        if proc is not None and src.proc != proc:
            continue
        if wanted is not None and src.proc not in wanted:
            continue
        lines, cut = _lines(node, src)
        lvls = levels(lines)
        hits = 0
        for i, (line, lv) in enumerate(zip(lines, lvls, strict=True)):
            if floor >= 0 and (lv is None or LEVELS.index(lv) < floor):
                continue
            if needle and needle not in line.lower():
                continue
            hits += 1
            matched.append({"proc": src.proc, "mesh": src.label, "rank": src.rank,
                            "line": i + 1, "level": lv, "text": line})  # fmt: skip
            if len(matched) > 4 * limit:
                del matched[: len(matched) - limit]
        total += hits
        searched.append(
            {
                "proc": src.proc,
                "mesh": src.label,
                "rank": src.rank,
                "coords": src.coords,
                "host": src.host,
                "file": src.path,
                "lines": len(lines),
                "matches": hits,
                "cut": cut,
            }
        )
    return {
        "lines": matched[-limit:],
        "matches": total,
        "truncated": total > limit,
        "procs": searched,
        "levels": list(LEVELS),
    }


def _procs_of(node: Node, mesh: str | None, rank: int | None, found: list[Source]) -> set[str]:
    """The procs of ``mesh`` (an actor mesh, as the actors table names it, or a proc
    mesh's label) at ``rank`` (any rank when None)."""
    out = {
        s.proc
        for s in found
        if (mesh is None or s.label == mesh) and (rank is None or s.rank == rank)
    }
    try:
        rows = table(node, "SELECT DISTINCT mesh, rank, proc FROM actors")
    except ImportError:
        rows = []  # without DuckDB: the proc meshes' labels alone
    for r in rows:
        mine = (mesh is None or r["mesh"] == mesh) and (rank is None or r["rank"] == rank)
        if mine and r["proc"]:
            out.add(r["proc"])
    return out
