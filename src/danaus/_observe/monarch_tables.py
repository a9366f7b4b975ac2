"""Monarch's telemetry tables, as views over danaus's: what ``state.query_engine_client``
answers, so a Monarch notebook's SQL runs with only its imports changed.

Monarch's distributed telemetry (``monarch_telemetry_schema``) has the tables
``actors``, ``meshes``, ``actor_status_events``, ``messages``,
``message_status_events``, ``sent_messages``, ``spans``, ``span_events``, ``events``,
``metric_gauges``, ``metric_sums`` and ``metric_histograms`` (and py-spy and mesh-admin
snapshot tables). Each is a DuckDB view here, computed from danaus's own tables
(``tables.COLUMNS``: actors, messages, spans, metrics), with Monarch's column names
and types (``u64`` is ``UBIGINT``, ``i64`` ``BIGINT``, ``u32`` ``UINTEGER``). A column
danaus has no data for is NULL, and ``COLUMNS`` says why (docs/monarch-tables.md
prints the same).

- **Ids.** Monarch's ids are opaque 64-bit join keys; here each is DuckDB's
  ``hash()`` of what names the thing in danaus (an actor: ``PROC/MESH_ID[RANK]``,
  as ``messages.sender`` writes it; a mesh: its ``mesh_id``), so the same actor has
  the same id in every table and every query.
- **Times** are microseconds since the Unix epoch (``timestamp_us``).

The views are ``TEMP`` views of the connection that runs one Monarch query, so they
shadow danaus's ``actors``, ``messages`` and ``spans`` for that query only and vanish
with it; danaus's own tables are read by their catalog-qualified names. This works
the same on a fresh in-memory database of live rows and on a cursor of the kept
history file: both hold danaus's tables under their names.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

__all__ = ["COLUMNS", "NOT_MAPPED", "asked", "describe", "install", "monarch_schema"]

#: Monarch's tables: each column as (name, DuckDB type, where danaus's value comes
#: from, or "NULL: why"). The views below give exactly these columns in this order.
COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "actors": [
        ("id", "UBIGINT", "hash of full_name"),
        ("timestamp_us", "BIGINT", "actors.started (the client's root actor: its first message)"),
        ("mesh_id", "UBIGINT", "hash of actors.mesh_id, as meshes.id (NULL for the client)"),
        ("rank", "UBIGINT", "actors.rank (NULL for the client)"),
        (
            "full_name",
            "VARCHAR",
            "PROC/MESH_ID[RANK], as messages.sender names an actor; "
            "the client's proc for the client's root actor",
        ),
        ("display_name", "VARCHAR", "MESH[RANK] (messages.receiver); '<root>' for the client"),
    ],
    "meshes": [
        ("id", "UBIGINT", "hash of actors.mesh_id"),
        ("timestamp_us", "BIGINT", "the earliest actors.started of the mesh"),
        ("class", "VARCHAR", "'Python<CLASS>' from actors.class"),
        ("given_name", "VARCHAR", "actors.mesh (the name given to spawn)"),
        ("full_name", "VARCHAR", "actors.mesh_id (the name with a unique suffix)"),
        (
            "shape_json",
            "VARCHAR",
            "NULL: danaus's tables keep each actor's rank, not the mesh's labels and sizes",
        ),
        (
            "parent_mesh_id",
            "UBIGINT",
            "NULL: danaus's tables do not record proc meshes, "
            "nor which proc mesh an actor mesh was spawned on",
        ),
        ("parent_view_json", "VARCHAR", "NULL: as parent_mesh_id"),
    ],
    "actor_status_events": [
        ("id", "UBIGINT", "hash of the actor and the status"),
        (
            "timestamp_us",
            "BIGINT",
            "Created: actors.started; Stopped/Failed: actors.stopped; "
            "a live actor's current status: actors.started (danaus keeps "
            "when an actor started and ended, not each change)",
        ),
        ("actor_id", "UBIGINT", "actors.id"),
        (
            "new_status",
            "VARCHAR",
            "Created for every actor, then its state now: Initializing "
            "(starting), Idle, Processing (running NAME()), Stopping, "
            "Stopped, Failed (failed, or its proc lost), Unknown "
            "(its proc not answering)",
        ),
        ("reason", "VARCHAR", "actors.failure for Failed, 'stopped' for Stopped, else NULL"),
    ],
    "messages": [
        (
            "id",
            "UBIGINT",
            "hash of the receiver and the message's times (kept history) or "
            "its place among the receiver's recent messages (live rows)",
        ),
        (
            "timestamp_us",
            "BIGINT",
            "messages.started (when the endpoint began: Monarch's 'active')",
        ),
        ("from_actor_id", "UBIGINT", "hash of messages.sender: actors.id of the sender"),
        ("to_actor_id", "UBIGINT", "actors.id of the receiver"),
        ("endpoint", "VARCHAR", "messages.endpoint"),
        ("port_index", "UBIGINT", "NULL: danaus addresses endpoints by name, not by port index"),
    ],
    "message_status_events": [
        ("id", "UBIGINT", "hash of the message and the status"),
        (
            "timestamp_us",
            "BIGINT",
            "queued: messages.arrived; active: messages.started; "
            "complete or failed: messages.ended",
        ),
        ("message_id", "UBIGINT", "messages.id"),
        ("status", "VARCHAR", "queued, active, then complete (or failed: messages.ok false)"),
    ],
    "sent_messages": [
        (
            "id",
            "UBIGINT",
            "NULL (no rows): danaus records each message where it is received "
            "(messages), not each cast where it is sent",
        ),
        ("timestamp_us", "BIGINT", "NULL (no rows): as id"),
        ("sender_actor_id", "UBIGINT", "NULL (no rows): as id"),
        ("actor_mesh_id", "UBIGINT", "NULL (no rows): as id"),
        ("view_json", "VARCHAR", "NULL (no rows): as id"),
        ("shape_json", "VARCHAR", "NULL (no rows): as id"),
    ],
    "spans": [
        (
            "id",
            "UBIGINT",
            "hash of spans.span_id; without one, of the proc, name and times "
            "(kept history) or place among the proc's spans (live rows)",
        ),
        ("name", "VARCHAR", "spans.name"),
        ("target", "VARCHAR", "'danaus.' and the span's kind (endpoint, user, transfer ...)"),
        ("level", "VARCHAR", "'INFO': danaus's spans have no level"),
        ("fields_json", "VARCHAR", "spans.attributes (a JSON object)"),
        ("timestamp_us", "BIGINT", "spans.started"),
        ("parent_id", "UBIGINT", "hash of spans.parent_id: the parent's id"),
        (
            "thread_name",
            "VARCHAR",
            "spans.actor (MESH[RANK]; NULL outside actors): danaus does not keep the thread's name",
        ),
        ("file", "VARCHAR", "NULL: danaus's spans do not record where they were opened"),
        ("line", "UINTEGER", "NULL: as file"),
    ],
    "span_events": [
        ("id", "UBIGINT", "spans.id"),
        ("timestamp_us", "BIGINT", "enter: spans.started; exit and close: spans.ended"),
        ("event_type", "VARCHAR", "enter, exit, close (a danaus span is entered once)"),
    ],
    "events": [
        (
            "name",
            "VARCHAR",
            "NULL (no rows): danaus's log records go to the procs' log "
            "files (danaus logs), not to the tables",
        ),
        ("target", "VARCHAR", "NULL (no rows): as name"),
        ("level", "VARCHAR", "NULL (no rows): as name"),
        ("fields_json", "VARCHAR", "NULL (no rows): as name"),
        ("timestamp_us", "BIGINT", "NULL (no rows): as name"),
        ("parent_span", "UBIGINT", "NULL (no rows): as name"),
        ("thread_id", "VARCHAR", "NULL (no rows): as name"),
        ("thread_name", "VARCHAR", "NULL (no rows): as name"),
        ("module_path", "VARCHAR", "NULL (no rows): as name"),
        ("file", "VARCHAR", "NULL (no rows): as name"),
        ("line", "UINTEGER", "NULL (no rows): as name"),
    ],
    "metric_gauges": [
        (
            "name",
            "VARCHAR",
            "danaus.actor.queued, danaus.endpoint.latency.max, .p50, .p99 "
            "(metrics rows queued, latency_max_s, latency_p50_s, latency_p99_s)",
        ),
        ("timestamp_us", "BIGINT", "metrics.time"),
        ("start_timestamp_us", "BIGINT", "NULL: a gauge has none"),
        ("scope_name", "VARCHAR", "'danaus' (the meter of danaus's built-in metrics)"),
        ("unit", "VARCHAR", "'s' for latencies, '1' for counts"),
        (
            "attributes_json",
            "VARCHAR",
            "danaus.mesh, danaus.rank, danaus.endpoint, danaus.proc "
            "(those not NULL), as exported over OpenTelemetry",
        ),
        ("resource_attributes_json", "VARCHAR", "danaus.proc and host.name"),
        ("value_f64", "DOUBLE", "metrics.value"),
        ("value_i64", "BIGINT", "NULL: values are in value_f64"),
        ("value_u64", "UBIGINT", "NULL: values are in value_f64"),
    ],
    "metric_sums": [
        (
            "name",
            "VARCHAR",
            "danaus.endpoint.calls, .errors, danaus.endpoint.latency.sum, "
            "danaus.actor.received, danaus.proc.bytes_sent, .bytes_received, "
            ".frames_sent, .frames_received, .messages_seen (the metrics rows "
            "of the same names)",
        ),
        ("timestamp_us", "BIGINT", "metrics.time"),
        (
            "start_timestamp_us",
            "BIGINT",
            "NULL: danaus's counters count from when their actor "
            "or proc started; metrics does not say when",
        ),
        ("scope_name", "VARCHAR", "'danaus'"),
        ("unit", "VARCHAR", "'By' for bytes, 's' for the latency sum, else '1'"),
        ("temporality", "VARCHAR", "'cumulative' (each row is a total since the start)"),
        ("is_monotonic", "BOOLEAN", "true"),
        ("attributes_json", "VARCHAR", "as metric_gauges"),
        ("resource_attributes_json", "VARCHAR", "as metric_gauges"),
        ("sum_f64", "DOUBLE", "the latency sum (seconds), else NULL"),
        ("sum_i64", "BIGINT", "NULL: counts are in sum_u64"),
        ("sum_u64", "UBIGINT", "metrics.value of the counters"),
    ],
    "metric_histograms": [
        (
            name,
            typ,
            "NULL (no rows): danaus's tables keep latency percentiles (metric_gauges), "
            "not bucket counts; the histograms go to OpenTelemetry and Prometheus"
            if name == "name"
            else "NULL (no rows): as name",
        )
        for name, typ in (
            ("name", "VARCHAR"),
            ("timestamp_us", "BIGINT"),
            ("start_timestamp_us", "BIGINT"),
            ("scope_name", "VARCHAR"),
            ("unit", "VARCHAR"),
            ("temporality", "VARCHAR"),
            ("attributes_json", "VARCHAR"),
            ("resource_attributes_json", "VARCHAR"),
            ("count", "UBIGINT"),
            ("sum_f64", "DOUBLE"),
            ("sum_i64", "BIGINT"),
            ("sum_u64", "UBIGINT"),
            ("min_f64", "DOUBLE"),
            ("min_i64", "BIGINT"),
            ("min_u64", "UBIGINT"),
            ("max_f64", "DOUBLE"),
            ("max_i64", "BIGINT"),
            ("max_u64", "UBIGINT"),
            ("bounds_json", "VARCHAR"),
            ("bucket_counts_json", "VARCHAR"),
        )
    ],
}

#: Monarch's tables with no view here, and why.
NOT_MAPPED: dict[str, str] = {
    "pyspy_dumps, pyspy_stack_traces, pyspy_frames, pyspy_local_variables": (
        "danaus keeps no stack dumps: the dashboard's stack button and `danaus top` "
        "take one when asked (py-spy), and QueryEngineClient has no store_pyspy_dump"
    ),
    "snapshots, nodes, root_nodes, host_nodes, proc_nodes, actor_nodes, children, "
    "actor_failures, actor_inbound_orderings, ordering_sessions, resolution_errors": (
        "Monarch's mesh-admin topology snapshots: danaus has no mesh admin server; its "
        "topology is the dashboard's state document"
    ),
}

# Each view's SELECT; {db} is the catalog holding danaus's tables. (hash(NULL) is not
# NULL in DuckDB: a key that may be NULL is hashed under a CASE.) An actor's name,
# PROC/MESH_ID[RANK], is what messages.sender holds for an actor that called.
_ACTOR = "(a.proc || '/' || a.mesh_id || '[' || a.rank || ']')"
_US = "CAST(round({} * 1e6) AS BIGINT)"

# Merged into {} (braces doubled for str.format), the NULL attributes drop out, as in OTel.
_ATTRS = (
    "json_merge_patch('{{}}', json_object('danaus.mesh', mesh, 'danaus.rank', rank, "
    "'danaus.endpoint', endpoint, 'danaus.proc', proc))"
)
_RESOURCE = "json_object('danaus.proc', proc, 'host.name', host)"
_GAUGES = {
    "queued": ("danaus.actor.queued", "1"),
    "latency_max_s": ("danaus.endpoint.latency.max", "s"),
    "latency_p50_s": ("danaus.endpoint.latency.p50", "s"),
    "latency_p99_s": ("danaus.endpoint.latency.p99", "s"),
}
_SUMS = {
    "calls": ("danaus.endpoint.calls", "1"),
    "errors": ("danaus.endpoint.errors", "1"),
    "latency_sum_s": ("danaus.endpoint.latency.sum", "s"),
    "received": ("danaus.actor.received", "1"),
    "bytes_sent": ("danaus.proc.bytes_sent", "By"),
    "bytes_received": ("danaus.proc.bytes_received", "By"),
    "frames_sent": ("danaus.proc.frames_sent", "1"),
    "frames_received": ("danaus.proc.frames_received", "1"),
    "messages_seen": ("danaus.proc.messages_seen", "1"),
}


def _case(column: str, mapping: dict[str, tuple[str, str]], part: int) -> str:
    arms = " ".join(f"WHEN '{k}' THEN '{v[part]}'" for k, v in mapping.items())
    return f"CASE {column} {arms} END"


def _in(mapping: dict[str, Any]) -> str:
    return ", ".join(f"'{k}'" for k in mapping)


def _empty(table: str) -> str:
    cols = ", ".join(f'NULL::{typ} AS "{name}"' for name, typ, _ in COLUMNS[table])
    return f"SELECT {cols} WHERE false"


_VIEWS: dict[str, str] = {
    "actors": f"""
        SELECT hash({_ACTOR}) AS id, {_US.format("a.started")} AS timestamp_us,
               hash(a.mesh_id) AS mesh_id, a.rank::UBIGINT AS rank,
               {_ACTOR} AS full_name, a.mesh || '[' || a.rank || ']' AS display_name
        FROM {{db}}.main.actors AS a
        UNION ALL
        SELECT hash(sender), {_US.format("min(arrived)")}, NULL, NULL, sender, '<root>'
        FROM {{db}}.main.messages
        WHERE sender IS NOT NULL AND NOT contains(sender, '/')
        GROUP BY sender
    """,
    "meshes": f"""
        SELECT hash(a.mesh_id) AS id, {_US.format("min(a.started)")} AS timestamp_us,
               'Python<' || max(a.class) || '>' AS class, any_value(a.mesh) AS given_name,
               a.mesh_id AS full_name, NULL::VARCHAR AS shape_json,
               NULL::UBIGINT AS parent_mesh_id, NULL::VARCHAR AS parent_view_json
        FROM {{db}}.main.actors AS a
        GROUP BY a.mesh_id
    """,
    "actor_status_events": f"""
        WITH s AS (
            SELECT {_ACTOR} AS actor, a.started, a.stopped,
                   CASE WHEN a.state = 'idle' THEN 'Idle'
                        WHEN a.state LIKE 'running %' THEN 'Processing'
                        WHEN a.state = 'starting' THEN 'Initializing'
                        WHEN a.state = 'stopping' THEN 'Stopping'
                        WHEN a.state = 'stopped' THEN 'Stopped'
                        WHEN a.state IN ('failed', 'lost') THEN 'Failed'
                        ELSE 'Unknown' END AS status,
                   a.failure
            FROM {{db}}.main.actors AS a
        )
        SELECT hash(actor, 'Created') AS id, {_US.format("started")} AS timestamp_us,
               hash(actor) AS actor_id, 'Created' AS new_status, NULL::VARCHAR AS reason
        FROM s WHERE started IS NOT NULL
        UNION ALL
        SELECT hash(actor, status), {_US.format("coalesce(stopped, started)")}, hash(actor),
               status,
               CASE status WHEN 'Failed' THEN coalesce(failure, 'failed')
                           WHEN 'Stopped' THEN coalesce(failure, 'stopped') END
        FROM s
    """,
    "messages": f"""
        SELECT {{message_id}} AS id, {_US.format("a.started")} AS timestamp_us,
               CASE WHEN a.sender IS NOT NULL THEN hash(a.sender) END AS from_actor_id,
               hash({_ACTOR}) AS to_actor_id,
               a.endpoint AS endpoint, NULL::UBIGINT AS port_index
        FROM {{db}}.main.messages AS a
    """,
    "message_status_events": f"""
        WITH m AS (
            SELECT {{message_id}} AS id, a.arrived, a.started, a.ended, a.ok
            FROM {{db}}.main.messages AS a
        )
        SELECT hash(id, 'queued') AS id, {_US.format("arrived")} AS timestamp_us,
               id AS message_id, 'queued' AS status FROM m
        UNION ALL
        SELECT hash(id, 'active'), {_US.format("started")}, id, 'active' FROM m
        UNION ALL
        SELECT hash(id, 'end'), {_US.format("ended")}, id,
               CASE WHEN ok THEN 'complete' ELSE 'failed' END FROM m
    """,
    "sent_messages": _empty("sent_messages"),
    "spans": f"""
        SELECT {{span_id}} AS id, name,
               'danaus.' || coalesce(json_extract_string(attributes, '$.kind'), 'span')
                   AS target,
               'INFO' AS level, attributes AS fields_json,
               {_US.format("started")} AS timestamp_us,
               CASE WHEN parent_id IS NOT NULL THEN hash(parent_id) END AS parent_id,
               actor AS thread_name, NULL::VARCHAR AS file, NULL::UINTEGER AS line
        FROM {{db}}.main.spans AS a
    """,
    "span_events": f"""
        WITH s AS (
            SELECT {{span_id}} AS id, started, ended
            FROM {{db}}.main.spans AS a
        )
        SELECT id, {_US.format("started")} AS timestamp_us, 'enter' AS event_type FROM s
        UNION ALL
        SELECT id, {_US.format("ended")}, 'exit' FROM s
        UNION ALL
        SELECT id, {_US.format("ended")}, 'close' FROM s
    """,
    "events": _empty("events"),
    "metric_gauges": f"""
        SELECT {_case("name", _GAUGES, 0)} AS name, {_US.format("time")} AS timestamp_us,
               NULL::BIGINT AS start_timestamp_us, 'danaus' AS scope_name,
               {_case("name", _GAUGES, 1)} AS unit, {_ATTRS}::VARCHAR AS attributes_json,
               {_RESOURCE}::VARCHAR AS resource_attributes_json, value AS value_f64,
               NULL::BIGINT AS value_i64, NULL::UBIGINT AS value_u64
        FROM {{db}}.main.metrics
        WHERE name IN ({_in(_GAUGES)}) AND value IS NOT NULL
    """,
    "metric_sums": f"""
        SELECT {_case("name", _SUMS, 0)} AS name, {_US.format("time")} AS timestamp_us,
               NULL::BIGINT AS start_timestamp_us, 'danaus' AS scope_name,
               {_case("name", _SUMS, 1)} AS unit, 'cumulative' AS temporality,
               true AS is_monotonic, {_ATTRS}::VARCHAR AS attributes_json,
               {_RESOURCE}::VARCHAR AS resource_attributes_json,
               CASE WHEN name = 'latency_sum_s' THEN value END AS sum_f64,
               NULL::BIGINT AS sum_i64,
               CASE WHEN name <> 'latency_sum_s' THEN CAST(value AS UBIGINT) END AS sum_u64
        FROM {{db}}.main.metrics
        WHERE name IN ({_in(_SUMS)}) AND value IS NOT NULL
    """,
    "metric_histograms": _empty("metric_histograms"),
}

_KEPT_KEYS = {
    "message_id": "hash(a.proc, a.mesh_id, a.rank, a.arrived, a.started)",
    "span_id": "CASE WHEN a.span_id IS NOT NULL THEN hash(a.span_id) "
    "ELSE hash(a.proc, a.name, a.started, a.ended) END",
}
_LIVE_KEYS = {
    "message_id": "hash(a.proc, a.mesh_id, a.rank, row_number() OVER (PARTITION BY a.proc, "
    "a.mesh_id, a.rank ORDER BY a.arrived, a.started, a.ended))",
    "span_id": "CASE WHEN a.span_id IS NOT NULL THEN hash(a.span_id) ELSE hash(a.proc, "
    "a.name, row_number() OVER (PARTITION BY a.proc ORDER BY a.started, a.ended, a.name)) END",
}

TABLES = tuple(COLUMNS)

_asked: contextvars.ContextVar[bool] = contextvars.ContextVar("monarch_tables", default=False)


@contextlib.contextmanager
def monarch_schema() -> Iterator[None]:
    """Within it, a query on this thread reads Monarch's tables (``install`` runs)."""
    token = _asked.set(True)
    try:
        yield
    finally:
        _asked.reset(token)


def asked() -> bool:
    """Whether the query being prepared is a Monarch one (``monarch_schema``)."""
    return _asked.get()


def install(con: Any) -> None:
    """Create Monarch's tables as TEMP views on ``con``, a DuckDB connection that holds
    danaus's tables (fresh in-memory ones, or a cursor of the history file)."""
    row = con.execute("SELECT current_database()").fetchone()
    name = str(row[0])
    db = '"' + name.replace('"', '""') + '"'
    # Live rows (sql.py's fresh in-memory database) get their wall times anew from each
    # proc's clocks at every query, a few microseconds apart: a message's or span's id
    # is then its place among its actor's (proc's) rows, which holds until the ring
    # drops the oldest. Rows kept in a file keep their times, which make the id.
    keys = _LIVE_KEYS if name == "memory" else _KEPT_KEYS
    for table, select in _VIEWS.items():
        cols = ", ".join(f'"{name}"' for name, _, _ in COLUMNS[table])
        body = select.format(db=db, **keys)
        con.execute(
            f'CREATE OR REPLACE TEMP VIEW "{table}" AS SELECT {cols} FROM ({body}) AS _{table}'
        )


def install_if_asked(con: Any) -> None:
    """``install`` when the query is a Monarch one (``monarch_schema``), else nothing."""
    if _asked.get():
        install(con)


def describe() -> str:
    """Monarch's tables and their columns, one line a table."""
    return "\n".join(
        f"{t}({', '.join(name for name, _, _ in cols)})" for t, cols in COLUMNS.items()
    )
