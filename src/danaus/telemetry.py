"""``danaus.telemetry``: a live mesh seen through the tools clusters already run.

- ``query(sql)``: SQL over the tables ``actors``, ``messages``, ``spans`` and
  ``metrics`` of every proc this client spawned, as they are now, answered by
  embedded DuckDB (``pip install 'danaus[query]'``); the rows as dicts. The same
  from a terminal: ``danaus query "SELECT ..."`` (through the client's dashboard).
- ``serve_metrics(port=...)``: a ``/metrics`` endpoint in Prometheus's text
  format for the whole mesh (``pip install 'danaus[prometheus]'``); the
  dashboard serves the same at its own ``/metrics``.

The columns of each table and the metrics' names are in ``docs/observing.md``.
"""

from __future__ import annotations

from ._observe.prom import MetricsServer as MetricsServer
from ._observe.prom import serve_metrics as serve_metrics
from ._observe.sql import QueryError as QueryError
from ._observe.sql import query as query

__all__ = ["MetricsServer", "QueryError", "query", "serve_metrics"]

for _obj in (MetricsServer, QueryError, query, serve_metrics):
    _obj.__module__ = __name__
del _obj
