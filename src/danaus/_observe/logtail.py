"""The last log lines of each proc, as the client received them (for the dashboard).

The lines the log forwarder printed in this client (``danaus._runtime.logs``
keeps a bounded tail per proc), plus a bounded ring per proc (the
``logtail_lines`` setting) for lines delivered some other way through
:func:`append`; the dashboard shows :func:`tail` per proc and attaches it
to failure reports.

This is the interface the log forwarder feeds: ``append(proc, line,
stream=...)`` with the proc's name (``ProcId.name``), one line without its
newline, and the stream it came from (``"stdout"``, ``"stderr"`` or a
logging level name). It is safe from any thread and never blocks for long.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from .. import _config as config

__all__ = ["append", "clear", "procs", "tail"]

# One process-wide store: the client receives every proc's lines through one
# forwarder, and the dashboard of that same client reads them.
_lock = threading.Lock()
_rings: dict[str, collections.deque[tuple[float, str, str]]] = {}


def append(proc: str, line: str, stream: str = "stdout") -> None:
    """Keep ``line`` (one line of proc ``proc``'s ``stream``) as its latest."""
    with _lock:
        ring = _rings.get(proc)
        if ring is None:
            ring = _rings[proc] = collections.deque(maxlen=max(1, config.get("logtail_lines")))
        ring.append((time.time(), stream, line.rstrip("\n")))


def tail(proc: str, n: int | None = None) -> list[dict[str, Any]]:
    """The last ``n`` (default: all kept) lines of ``proc``, oldest first: those the
    log forwarder printed in this client (``danaus._runtime.logs``), then any appended."""
    forwarded = [(0.0, "", line) for line in _forwarded(proc)]
    with _lock:
        ring = forwarded + list(_rings.get(proc, ()))
    if n is not None:
        ring = ring[-n:] if n > 0 else []
    return [{"time": t, "stream": s, "line": line} for t, s, line in ring]


def _forwarded(proc: str) -> list[str]:
    from .._runtime import logs  # the forwarder's own bounded tail of what it printed

    return logs.tail(proc, max(1, config.get("logtail_lines")))


def procs() -> list[str]:
    """The procs that have lines kept."""
    with _lock:
        return list(_rings)


def clear(proc: str | None = None) -> None:
    """Forget the lines of ``proc`` (or of every proc)."""
    with _lock:
        if proc is None:
            _rings.clear()
        else:
            _rings.pop(proc, None)
