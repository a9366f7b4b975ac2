"""What the pages' routes share: answers, query parameters, and reading the tables."""

from __future__ import annotations

import json
import math
from typing import Any

from ..._runtime.node import Node
from ..sql import QueryError, query_on
from ..web import SECURITY_HEADERS, aiohttp_web

__all__ = ["BadRequest", "answer", "as_json", "json_route", "number", "quote", "table"]

MAX_SECONDS = 30 * 86400.0  # the longest window a page asks for (retention may keep less)


class BadRequest(ValueError):
    """A query parameter that is not what the route takes (answered 400 with the message)."""


def answer(code: int, body: bytes, ctype: str, **headers: str) -> Any:
    web = aiohttp_web()
    return web.Response(
        status=code, body=body, headers={**SECURITY_HEADERS, "Content-Type": ctype, **headers}
    )


def as_json(code: int, doc: Any, **headers: str) -> Any:
    return answer(code, json.dumps(doc, default=_plain).encode(), "application/json", **headers)


def _plain(x: Any) -> Any:
    return str(x)


def number(request: Any, name: str, default: float, lo: float, hi: float) -> float:
    """Query parameter ``name`` as a finite number in [lo, hi]; ``BadRequest`` else."""
    raw = request.query.get(name, "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and lo <= value <= hi):
        raise BadRequest(f"{name} must be a number from {lo:g} to {hi:g}, got {raw!r}")
    return value


def quote(text: str) -> str:
    """``text`` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def table(node: Node, sql: str) -> list[dict[str, Any]]:
    """Rows of ``sql`` over the telemetry tables of ``node``'s client
    (``danaus.telemetry.query``: the live procs, or the kept history when a job keeps
    one). Blocking: call through ``web.blocking``. ``ImportError`` without DuckDB,
    ``QueryError`` for bad SQL."""
    return [{k: _finite(v) for k, v in row.items()} for row in query_on(node, sql)]


def _finite(v: Any) -> Any:
    """JSON has no NaN or infinity: those become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def json_route(fn: Any) -> Any:
    """An async route answering ``await fn(request)`` as JSON, and its errors as 400
    (a bad parameter, SQL the tables refuse) or 501 (DuckDB missing), with the reason."""

    async def route(request: Any) -> Any:
        try:
            return as_json(200, await fn(request))
        except (BadRequest, QueryError) as e:
            return as_json(400, {"error": str(e)})
        except ImportError as e:
            return as_json(501, {"error": str(e)})

    return route
