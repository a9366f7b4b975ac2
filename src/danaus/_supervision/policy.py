"""What a supervisor restarts by and what it records: its strategies, the backoff
between restarts, one restart."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

STRATEGIES = ("one_for_one", "one_for_all", "rest_for_one")


@dataclass(frozen=True)
class Backoff:
    """Wait before each restart: ``initial`` seconds, doubled for each restart already
    made within the supervisor's period, at most ``cap``."""

    initial: float
    cap: float

    def __post_init__(self) -> None:
        for what, v in (("initial", self.initial), ("cap", self.cap)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TypeError(f"Backoff {what} must be a number of seconds, got {v!r}")
            if v < 0:
                raise ValueError(f"Backoff {what} must be >= 0 seconds, got {v!r}")
        if self.cap < self.initial:
            raise ValueError(
                f"Backoff cap ({self.cap!r} s) must be at least its initial delay "
                f"({self.initial!r} s)"
            )

    def delay(self, earlier: int) -> float:
        """The wait before a restart that follows ``earlier`` restarts within the period."""
        return float(min(self.cap, self.initial * 2 ** min(earlier, 64)))


def retry_delay(tries: int, initial: float, cap: float) -> float:
    """The wait before a supervisor places again ranks that no host took, after ``tries``
    such tries in a row: ``initial`` seconds, doubled each time, at most ``cap`` (the
    settings ``restart_retry_initial`` and ``restart_retry_cap``)."""
    return float(min(cap, initial * 2 ** min(tries, 64)))


@dataclass(frozen=True)
class Restart:
    """One restart a supervisor made: when (``time.time()``), which child (a mesh's or a
    nested supervisor's name), which of its ranks, why; ``delay`` is the backoff it
    waited and ``failed_at`` when it saw the failure (``time.time()``)."""

    time: float
    child: str
    ranks: tuple[int, ...]
    reason: str
    delay: float = 0.0
    failed_at: float = 0.0
    supervisor: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "child": self.child,
            "ranks": list(self.ranks),
            "reason": self.reason,
            "delay": self.delay,
            "failed_at": self.failed_at,
            "supervisor": self.supervisor,
        }


def checked(
    strategy: str,
    max_restarts: int,
    period: float,
    backoff: Backoff | tuple[float, float] | None,
    spare_hosts: Any,
    name: str,
) -> Backoff | None:
    """A supervisor's arguments, checked (``ValueError``/``TypeError`` naming the bad
    one); returns its backoff as a [`Backoff`][danaus.supervisor.Backoff] (or None)."""
    if strategy not in STRATEGIES:
        raise ValueError(
            f"strategy must be one of {', '.join(map(repr, STRATEGIES))}, got {strategy!r}"
        )
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    if (
        isinstance(period, bool)
        or not isinstance(period, (int, float))
        or not math.isfinite(period)
        or period <= 0
    ):
        raise ValueError(f"period must be a number of seconds > 0, got {period!r}")
    if isinstance(backoff, tuple):
        if len(backoff) != 2:
            raise ValueError(f"backoff must be (initial, cap) in seconds, got {backoff!r}")
        backoff = Backoff(*backoff)
    if backoff is not None and not isinstance(backoff, Backoff):
        raise TypeError(f"backoff must be a Backoff, (initial, cap) or None, got {backoff!r}")
    if spare_hosts is not None and not hasattr(spare_hosts, "spawn_procs"):
        raise TypeError(f"spare_hosts must be a HostMesh, got {spare_hosts!r}")
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    return backoff
