"""The timeline page's data: spans and messages over a window, and a Chrome trace export.

``GET /api/ui/timeline?seconds=S[&proc=P][&actor=A]`` answers the rows of the
``spans`` and ``messages`` tables that ended in the last ``S`` seconds (default 300),
oldest first, at most ``MAX_EVENTS`` of each (the newest are kept; ``truncated``
says so), each with a ``track``: the actor (``MESH[RANK]``) or, outside actors, the
proc. ``proc`` and ``actor`` narrow them to one proc or one actor.

``GET /api/ui/trace.json`` answers the same rows in Chrome's trace event format
(``{"traceEvents": [...]}``: one complete event, ``"ph": "X"``, per span and per
message, a process per proc and a thread per track), which Perfetto
(ui.perfetto.dev) and ``chrome://tracing`` open.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..._runtime.node import Node
from ..web import Route, blocking
from .common import MAX_SECONDS, BadRequest, answer, json_route, number, quote, table

__all__ = ["chrome_trace", "events", "routes"]

MAX_EVENTS = 5000  # of spans, and of messages, in one answer


def routes(dash: Any) -> dict[str, Route]:
    async def get(request: Any) -> Any:
        return await blocking(events, dash.node, *_params(request))

    async def trace(request: Any) -> Any:
        try:
            doc = chrome_trace(await blocking(events, dash.node, *_params(request)))
        except BadRequest as e:
            return answer(400, f"{e}\n".encode(), "text/plain")
        return answer(
            200,
            json.dumps(doc).encode(),
            "application/json",
            **{"Content-Disposition": 'attachment; filename="danaus-trace.json"'},
        )

    return {"/api/ui/timeline": json_route(get), "/api/ui/trace.json": trace}


def _params(request: Any) -> tuple[float, str | None, str | None]:
    seconds = number(request, "seconds", 300.0, 0.001, MAX_SECONDS)
    return seconds, request.query.get("proc") or None, request.query.get("actor") or None


def events(
    node: Node, seconds: float, proc: str | None = None, actor: str | None = None
) -> dict[str, Any]:
    """The spans and messages of ``node``'s client that ended in the last ``seconds``
    (see the docstring)."""
    now = time.time()
    since = now - seconds
    where = [f"ended >= {since!r}"]
    if proc:
        where.append(f"proc = {quote(proc)}")
    span_where = where + ([f"actor = {quote(actor)}"] if actor else [])
    msg_where = where + ([f"receiver = {quote(actor)}"] if actor else [])
    spans = table(
        node,
        "SELECT name, actor, proc, host, started, ended, duration_s, trace_id, span_id, "
        f"parent_id, attributes FROM spans WHERE {' AND '.join(span_where)} "
        f"ORDER BY ended DESC LIMIT {MAX_EVENTS + 1}",
    )
    messages = table(
        node,
        "SELECT receiver, mesh, rank, proc, host, endpoint, sender, request_bytes, "
        "reply_bytes, arrived, started, ended, queued_s, handled_s, ok, sample_rate "
        f"FROM messages WHERE {' AND '.join(msg_where)} "
        f"ORDER BY ended DESC LIMIT {MAX_EVENTS + 1}",
    )
    truncated = len(spans) > MAX_EVENTS or len(messages) > MAX_EVENTS
    spans, messages = spans[:MAX_EVENTS][::-1], messages[:MAX_EVENTS][::-1]
    for s in spans:
        s["track"] = s["actor"] or s["proc"]
        try:
            s["attributes"] = json.loads(s["attributes"] or "{}")
        except ValueError:
            pass
    for m in messages:
        m["track"] = m["receiver"]
    return {
        "now": now,
        "since": since,
        "spans": spans,
        "messages": messages,
        "truncated": truncated,
    }


def chrome_trace(doc: dict[str, Any]) -> dict[str, Any]:
    """``events``'s answer in Chrome's trace event format (microseconds since the
    window's start; one pid per proc, one tid per track)."""
    t0 = float(doc["since"])
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    out: list[dict[str, Any]] = []

    def ids(proc: str, track: str) -> tuple[int, int]:
        if proc not in pids:
            pids[proc] = len(pids) + 1
            out.append({"ph": "M", "name": "process_name", "pid": pids[proc], "tid": 0,
                        "args": {"name": f"proc {proc}"}})  # fmt: skip
        key = (proc, track)
        if key not in tids:
            tids[key] = len(tids) + 1
            out.append({"ph": "M", "name": "thread_name", "pid": pids[proc], "tid": tids[key],
                        "args": {"name": track}})  # fmt: skip
        return pids[proc], tids[key]

    def us(t: float) -> float:
        return round((t - t0) * 1e6, 3)

    for s in doc["spans"]:
        pid, tid = ids(s["proc"] or "?", s["track"] or "?")
        args = {"trace_id": s["trace_id"], "span_id": s["span_id"], "parent_id": s["parent_id"]}
        if isinstance(s["attributes"], dict):
            args.update(s["attributes"])
        out.append({"ph": "X", "cat": "span", "name": s["name"], "pid": pid, "tid": tid,
                    "ts": us(s["started"]), "dur": us(s["ended"]) - us(s["started"]),
                    "args": args})  # fmt: skip
    for m in doc["messages"]:
        pid, tid = ids(m["proc"] or "?", m["track"] or "?")
        args = {k: m[k] for k in ("sender", "request_bytes", "reply_bytes", "queued_s", "ok")}
        out.append({"ph": "X", "cat": "message", "name": m["endpoint"], "pid": pid, "tid": tid,
                    "ts": us(m["started"]), "dur": us(m["ended"]) - us(m["started"]),
                    "args": args})  # fmt: skip
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {"source": "danaus", "since_unix_s": t0, "truncated": doc["truncated"]},
    }
