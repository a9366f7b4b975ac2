"""An endpoint's span as danaus records it on the hot path (a list of ids, times and
the actor, by index), and the attributes danaus's spans and metrics carry for an actor.

Shared by ``telemetry`` (which records the spans), ``span_export`` (which encodes them
for OTLP) and ``meters`` (which labels the endpoint metrics).
"""

from __future__ import annotations

import time
import weakref
from typing import Any

__all__ = ["actor_attributes_of", "ids_of"]

# An endpoint's span (or a transfer's), as recorded on the hot path: a list (made and
# filled faster than any object) of these fields.
_TRACE, _SPAN, _PARENT, _FLAGS = 0, 1, 2, 3  # ids (ints) and trace flags
_CELL = 4  # the actor's cell (its attributes are made from it), or a transfer's attributes
_NAME = 5  # the span's name: the endpoint's (the method), or "rdma.transfer"
_T0, _T1 = 6, 7  # start and end, time.perf_counter_ns()
_ERROR = 8  # the exception that ended it, or None
_KIND = 9  # OTLP's span kind: 2 (SERVER) for an endpoint, 1 (INTERNAL) for a transfer
_EndpointSpan = list[Any]


def _new_span(
    trace_id: int, span_id: int, parent_id: int, flags: int, cell: Any, name: str, kind: int = 2
) -> list[Any]:
    return [trace_id, span_id, parent_id, flags, cell, name, time.perf_counter_ns(), 0, None, kind]


# cache: each actor instance's attributes, made once
_attrs_of: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def actor_attributes_of(inst: Any) -> dict[str, Any]:
    """The attributes of actor instance ``inst`` (as ``actor_attributes``, no endpoint)."""
    base = _attrs_of.get(inst)
    if base is None:
        aid = inst.actor_id
        base = _attrs_of[inst] = {
            "danaus.actor": str(aid),
            "danaus.actor.class": inst.class_name,
            "danaus.mesh": inst.name,
            "danaus.rank": aid.rank,
            "danaus.proc": aid.proc.name,
        }
    return base


# cache: per actor (its cell) and endpoint, the endpoint metrics' and spans' attributes
_ep_attrs: weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = weakref.WeakKeyDictionary()


def _endpoint_attributes(cell: Any, endpoint: str) -> dict[str, Any]:
    per = _ep_attrs.get(cell)
    if per is None:
        per = _ep_attrs[cell] = {}
    attrs = per.get(endpoint)
    if attrs is None:
        inst = cell.ctx_instance
        base = actor_attributes_of(inst) if inst is not None else {}
        attrs = per[endpoint] = {k: v for k, v in base.items() if k != "danaus.actor"} | {
            "danaus.endpoint": endpoint
        }
    return attrs


def ids_of(s: Any) -> tuple[str | None, str | None, str | None]:
    """An OpenTelemetry span's trace id, span id and parent span id, in hex (the
    spans table's ``trace_id``, ``span_id``, ``parent_id``); Nones for a span
    without a valid context. Of danaus's own endpoint spans, the ids as ints (the
    table formats them when it is read: nothing formatted per call)."""
    if type(s) is list:  # danaus's endpoint span: ints, formatted when the table is read
        return s[_TRACE], s[_SPAN], s[_PARENT]
    try:
        sc = s.get_span_context()
        if not sc.is_valid:
            return None, None, None
        parent = getattr(s, "parent", None)
        return (
            format(sc.trace_id, "032x"),
            format(sc.span_id, "016x"),
            format(parent.span_id, "016x") if parent is not None else None,
        )
    except Exception:  # a span of some other provider: keep the row without ids
        return None, None, None
