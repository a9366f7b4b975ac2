"""What both sides of a debug session share: who is paused (``SessionInfo``), the
bounded output kept for it (``OutputRing``), and the controller's name.

``remote`` (the proc side, with pdb) and ``controller`` (the actor in the client)
both build on this module, never on each other's internals.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from ... import _config as config

__all__ = ["CONTROLLER_NAME", "OutputRing", "SessionInfo"]

CONTROLLER_NAME = "debug_controller"


@dataclass(frozen=True)
class SessionInfo:
    """Who is paused, and where: sent to the controller when a session starts."""

    mesh_id: str
    name: str  # the name given to spawn()
    rank: int  # the actor's rank in its mesh
    coords: dict[str, int]
    host: str
    pid: int
    proc: str
    where: tuple[str, int, str] = ("?", 0, "?")  # file, line, function
    key: tuple[str, int] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.mesh_id, self.rank))


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} characters"


class OutputRing:
    """The last ``limit`` characters of a debug session's output, and how many were dropped.

    Positions count every character ever appended; `since()` gives the
    text from a position on, led by a marker line saying how much of it was
    dropped, and `clear()` starts a new stretch (what one pdb command
    printed). A session that prints forever holds at most ``limit``.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = max(1, limit if limit is not None else config.get("debug_output_max"))
        self._parts: collections.deque[str] = collections.deque()
        self._size = 0
        self.start = 0  # position of the first character kept
        self.end = 0  # position after the last one appended
        self.base = 0  # where the current stretch began (the last clear)

    def append(self, text: str) -> None:
        if not text:
            return
        self.end += len(text)
        self._parts.append(text)
        self._size += len(text)
        while self._size > self.limit:
            first, excess = self._parts[0], self._size - self.limit
            if len(first) <= excess:
                self._parts.popleft()
                cut = len(first)
            else:
                self._parts[0] = first[excess:]
                cut = excess
            self._size -= cut
            self.start += cut

    def since(self, pos: int | None = None) -> str:
        """The text of this stretch from ``pos`` (default: its beginning) to the end."""
        pos = self.base if pos is None else max(pos, self.base)
        marker = ""
        if pos < self.start:
            marker = (
                f"[... {_size(self.start - pos)} of debugger output dropped: a session keeps "
                f"the last {_size(self.limit)} (setting debug_output_max) ...]\n"
            )
            pos = self.start
        return marker + "".join(self._parts)[pos - self.start :]

    def clear(self) -> None:
        self._parts.clear()
        self._size = 0
        self.start = self.base = self.end
