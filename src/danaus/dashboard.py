"""``danaus.dashboard``: a live web view of the client's hosts, procs and actors.

``danaus.dashboard.serve(port=...)`` starts it from the client (or set
``DANAUS_DASHBOARD=1``); open ``dash.url``. The page shows every proc the
client spawned with its actors, their state, message counts and rates, queue
depths, latency histograms per endpoint, the log tail of each proc, failures
with their tracebacks, the RDMA buffers registered, and a stack dump button.
Its JSON API (``/api/state``, ``/api/events``, ``/api/stack``) is described
in ``docs/observing.md``. See also ``danaus top`` and ``danaus stack``.
"""

from __future__ import annotations

from ._observe.dashboard import Dashboard as Dashboard
from ._observe.dashboard import serve as serve

__all__ = ["Dashboard", "serve"]

Dashboard.__module__ = __name__
serve.__module__ = __name__
