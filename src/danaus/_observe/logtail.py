"""The last log lines of each proc, as the client received them (for the dashboard).

The lines the log forwarder printed in this client (``danaus._runtime.logs.process``
keeps a bounded tail per proc), plus a bounded ring per proc (the
``logtail_lines`` setting) for lines delivered some other way through
`append()`; the dashboard shows `tail()` per proc and attaches it
to failure reports.

This is the interface the log forwarder feeds: ``append(proc, line,
stream=...)`` with the proc's name (``ProcId.name``), one line without its
newline, and the stream it came from (``"stdout"``, ``"stderr"`` or a
logging level name). It is safe from any thread and never blocks for long.

The rings are the node's (a `Rings` part): a client's next session
starts with none of the lines of the one before.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from .. import _config as config
from .._runtime.logs import process as logs
from .._runtime.node import Node, this_node

__all__ = ["Rings", "append", "clear", "procs", "tail"]


class Rings:
    """The appended lines of each proc on this node (``node.part(Rings)``): the client
    receives every proc's lines through one forwarder, and its dashboard reads them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # guards rings
        self.rings: dict[str, collections.deque[tuple[float, str, str]]] = {}


def append(proc: str, line: str, stream: str = "stdout") -> None:
    """Keep ``line`` (one line of proc ``proc``'s ``stream``) as its latest.

    The public face (docs/observing.md: lines delivered some other way): the caller
    holds nothing, so this client's node is looked up.
    """
    r = this_node().part(Rings)
    with r.lock:
        ring = r.rings.get(proc)
        if ring is None:
            ring = r.rings[proc] = collections.deque(maxlen=max(1, config.get("logtail_lines")))
        ring.append((time.time(), stream, line.rstrip("\n")))


def tail(node: Node | None, proc: str, n: int | None = None) -> list[dict[str, Any]]:
    """The last ``n`` (default: all kept) lines of ``proc``, oldest first: those the
    log forwarder printed in ``node``'s client (``danaus._runtime.logs.process``), then
    any appended (none without a node)."""
    forwarded = [(0.0, "", line) for line in _forwarded(node, proc)]
    r = None if node is None else node.part(Rings)
    if r is None:
        ring = forwarded
    else:
        with r.lock:
            ring = forwarded + list(r.rings.get(proc, ()))
    if n is not None:
        ring = ring[-n:] if n > 0 else []
    return [{"time": t, "stream": s, "line": line} for t, s, line in ring]


def _forwarded(node: Node | None, proc: str) -> list[str]:
    # The forwarder's own bounded tail of what it printed.
    return logs.tail(node, proc, max(1, config.get("logtail_lines")))


def procs(node: Node | None) -> list[str]:
    """The procs that have lines kept on ``node`` (none without a node)."""
    r = None if node is None else node.part(Rings)
    if r is None:
        return []
    with r.lock:
        return list(r.rings)


def clear(node: Node, proc: str | None = None) -> None:
    """Forget the lines of ``proc`` (or of every proc) kept on ``node``."""
    r = node.part(Rings)
    with r.lock:
        if proc is None:
            r.rings.clear()
        else:
            r.rings.pop(proc, None)
