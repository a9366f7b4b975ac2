"""What a thread that blocks on a result talks to: the narrow interfaces of a wait.

A `Future` that must block tells its
thread's `Waits` before and after (an actor's inbox on the actor's
serial path, else the runtime), and may read the reply itself through the
`Reader` of the connection it will come on. Defined here, below both
the future and the inbox, so that neither imports the other for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["Reader", "Waits"]


class Waits(Protocol):
    """What a thread tells before and after it blocks on a result (an actor's inbox,
    or the runtime)."""

    def begin_wait(self) -> None: ...

    def end_wait(self) -> None: ...


class Reader(Protocol):
    """The connection a result will come on, which the waiting thread may read itself
    while no other thread does (``Connection.read_directly``; ``bell``: an eventfd
    whose ring ends the read). It returns whether ``done()`` held when it stopped
    reading, None when it could not read (another thread does)."""

    def read_directly(
        self, done: Callable[[], bool], timeout: float, bell: int = -1
    ) -> bool | None: ...
