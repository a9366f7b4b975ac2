"""The settings of observing."""

from __future__ import annotations

from ..setting import Setting, _GiB

OBSERVING: tuple[Setting, ...] = (
    Setting(
        "metrics",
        "bool",
        True,
        "Count calls, errors and latencies per endpoint and bytes and frames per "
        "connection in every proc (read with mesh.stats() and the dashboard).",
    ),
    Setting(
        "dashboard",
        "bool",
        False,
        "Start the web dashboard with the client's runtime (as if the program "
        "called danaus.dashboard.serve()); its address is printed to stderr.",
    ),
    Setting(
        "dashboard_host",
        "str",
        "127.0.0.1",
        "The address the dashboard listens on (empty: 127.0.0.1, only this machine; "
        "every interface, 0.0.0.0 or ::, needs dashboard_all_interfaces). It is "
        "authenticated by the token in its URL either way.",
    ),
    Setting(
        "dashboard_all_interfaces",
        "bool",
        False,
        "Let the dashboard listen on every interface (dashboard_host 0.0.0.0 or ::), "
        "with a warning; without it such a host is refused.",
    ),
    Setting(
        "dashboard_port",
        "int",
        0,
        "The dashboard's TCP port (0: any free port).",
    ),
    Setting(
        "dashboard_interval",
        "duration",
        0.25,
        "How often the dashboard collects the procs' statistics and pushes them to "
        "the open pages and to `danaus top`.",
    ),
    Setting(
        "dashboard_request_timeout",
        "duration",
        10.0,
        "A connection to any of danaus's HTTP endpoints (the dashboard, serve_metrics) "
        "must send a whole tokened request within this, and one idle this long between "
        "requests (or not reading an answer) is closed.",
    ),
    Setting(
        "dashboard_max_connections",
        "int",
        32,
        "Tokened connections each of danaus's HTTP endpoints (the dashboard, "
        "serve_metrics) keeps open at once (an open page's live updates, a scraper); "
        "beyond it a request gets 503. Connections without the token yet: at most "
        "max_pending_handshakes, the oldest closed beyond it.",
    ),
    Setting(
        "metrics_min_interval",
        "duration",
        1.0,
        "Prometheus scrapes (serve_metrics, the dashboard's /metrics) within this of "
        "the last collection get that collection again instead of asking every proc.",
    ),
    Setting(
        "metrics_max_series",
        "int",
        1000,
        "Endpoint label sets (mesh, class, proc mesh, endpoint, rank) a Prometheus "
        "exposition holds at most (each is 221 series: calls, errors and a histogram "
        "of 219); beyond it further ones are dropped, counted in "
        "danaus_metrics_dropped_series, and one warning is logged (0: no bound).",
    ),
    Setting(
        "query_max_rows",
        "int",
        100_000,
        "Rows a telemetry SQL query (danaus.telemetry.query, danaus query, the "
        "dashboard) may answer; beyond it the query fails saying so.",
    ),
    Setting(
        "query_timeout",
        "duration",
        30.0,
        "How long a telemetry SQL query may run before it is interrupted and fails.",
    ),
    Setting(
        "query_max_memory",
        "size",
        _GiB,
        "Memory DuckDB may use for one telemetry SQL query.",
    ),
    Setting(
        "port_forward_max_connections",
        "int",
        256,
        "Connections each PortForwarder source proc relays at once; beyond it a new one is reset.",
    ),
    Setting(
        "port_forward_allow_remote",
        "bool",
        False,
        "Let a PortForwarder source accept connections from other hosts (anyone who "
        "can reach its address); without it only this host's processes of the same "
        "user may connect.",
    ),
    Setting(
        "port_forward_idle_timeout",
        "duration",
        3600.0,
        "A PortForwarder connection on which no byte moved either way for this long "
        "is reset (0: never).",
    ),
    Setting(
        "stats_timeout",
        "duration",
        2.0,
        "How long collecting statistics (mesh.stats(), the dashboard) waits for a "
        "proc before showing it as not answering.",
    ),
    Setting(
        "stack_timeout",
        "duration",
        20.0,
        "How long a stack dump (dashboard button, `danaus stack`) may take per proc.",
    ),
    Setting(
        "pyspy_bin",
        "str",
        "",
        "Path of the py-spy executable stack dumps run, tried first; if it is empty or not "
        "an executable, py-spy beside the Python executable, then on PATH.",
    ),
    Setting(
        "trace_max_events",
        "int",
        2_000_000,
        "Spans one proc keeps during a trace; later ones are counted as dropped "
        "(the trace file says how many).",
    ),
    Setting(
        "query_ring_size",
        "int",
        10_000,
        "Rows each proc keeps per table for danaus.telemetry.query (its recent messages, "
        "spans and ended actors); older rows are dropped, so memory stays bounded.",
    ),
    Setting(
        "query_messages_per_s",
        "int",
        1_000,
        "Messages a second each proc records in full for danaus.telemetry.query; above it "
        "only 1 in N is kept (each row's sample_rate says which); 0: record every message.",
    ),
    Setting(
        "telemetry",
        "bool",
        False,
        "OpenTelemetry across the mesh: calls made inside a span carry its context and "
        "their endpoints run in child spans; each process exports its spans and metrics "
        "as the OTEL_* variables say (needs danaus[telemetry]; JobTrait.enable_telemetry "
        "turns it on too).",
    ),
    Setting(
        "logtail_lines",
        "int",
        200,
        "Log lines kept per proc for the dashboard's log tail and failure reports.",
    ),
    Setting(
        "rdma_ptracer",
        "str",
        "",
        "'any' lets any process of this user read procs' memory (for hardened "
        "kernels whose Yama ptrace_scope blocks process_vm_readv between siblings).",
    ),
)
