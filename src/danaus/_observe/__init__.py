"""Observing a running mesh: traces, the web dashboard, `danaus top`, stack dumps.

Capture happens where the work is (metrics and spans in ``_runtime`` and
``_actor``, answered by each proc's I/O thread through ``_actor/tools/introspect``);
this layer only collects and serves: ``trace`` (Chrome/Perfetto trace files,
OpenTelemetry), ``state`` (the host/proc/actor tree the dashboard shows),
``dashboard`` (its routes and JSON API), ``prom`` (Prometheus metrics), ``sql``
(SQL over the telemetry), ``history`` (a job's telemetry kept in a DuckDB file, with
retention), ``web`` (the one HTTP stack all of them are served on:
aiohttp on one loop thread, one token check, one set of limits), ``logtail`` (recent log
lines per proc) and ``console`` (`danaus top`).

Imports: every layer below; nothing imports it but the CLI and the facades.
"""
