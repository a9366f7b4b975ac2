"""The last log lines of each proc, as the client received them (for the dashboard).

A bounded ring per proc (the ``logtail_lines`` setting). Whatever delivers a
proc's output to the client calls :func:`append` for each line; the
dashboard shows :func:`tail` per proc and attaches it to failure reports.

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
    """The last ``n`` (default: all kept) lines of ``proc``, oldest first."""
    with _lock:
        ring = list(_rings.get(proc, ()))
    if n is not None:
        ring = ring[-n:] if n > 0 else []
    return [{"time": t, "stream": s, "line": line} for t, s, line in ring]


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
