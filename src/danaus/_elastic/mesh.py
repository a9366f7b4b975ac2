"""``ElasticMesh``: the client's handle on data-parallel replicas that survive losing some."""

from __future__ import annotations

import math
from typing import Any

from .._actor.api.hosts import this_host
from .coordinator import ElasticCoordinator, ElasticStats
from .replica import ElasticReplica

__all__ = ["ElasticMesh"]


class ElasticMesh:
    """``replicas`` data-parallel replicas of ``replica`` (an
    [`ElasticReplica`][danaus.elastic.ElasticReplica]
    subclass, built with ``args``/``kwargs``), plus ``spares`` idle ones ready to
    take a lost replica's place.

    ``step(k, *args)`` runs step ``k`` on every member to commit and returns
    ``(world_size, [train_step's value of each member])``. When a member is lost
    (its process killed, its host gone) the step in flight is abandoned and run
    again on the others at once, from the same state; a spare (or a replacement
    spawned for it) joins at a later step boundary with a healthy member's state.
    A coordinator actor in a proc of its own owns the replicas; the client sees
    no failure. ``timeout`` (seconds) bounds each call and each collective.
    ``hosts``: a ``HostMesh`` to spread the replicas and spares over (the least
    loaded host first; a host that just lost a member is the last choice for a
    replacement); default: this host.
    """

    def __init__(
        self,
        replica: type[ElasticReplica],
        *,
        replicas: int,
        spares: int = 1,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float = 60.0,
        hosts: Any = None,
    ) -> None:
        if not (isinstance(replica, type) and issubclass(replica, ElasticReplica)):
            raise TypeError(f"replica must be an ElasticReplica subclass, got {replica!r}")
        for name, value, low in (("replicas", replicas, 1), ("spares", spares, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not (isinstance(timeout, (int, float)) and timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if hosts is not None and not hasattr(hosts, "spawn_procs"):
            raise TypeError(f"hosts must be a HostMesh (or None: this host), got {hosts!r}")
        self.timeout = float(timeout)
        self._procs = this_host().spawn_procs(per_host={"procs": 1})
        self._coord: Any = self._procs.spawn(
            "elastic", ElasticCoordinator, replica, replicas, spares, tuple(args),
            dict(kwargs or {}), self.timeout, hosts,
        )  # fmt: skip
        self.pids: list[int] = self._coord.start.call_one().get(timeout=self._start_timeout)

    @property
    def _start_timeout(self) -> float:
        return 4 * self.timeout

    def step(self, step: int, *args: Any) -> tuple[int, list[Any]]:
        """Run ``step`` on every member to commit: (how many members committed it, the
        ``train_step`` values of those that computed it, in rank order; a member lost while
        committing computed it but did not commit it)."""
        world, values = self._coord.step.call_one(step, args).get(timeout=self._start_timeout)
        return world, values

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """The replica method ``method(*args, **kwargs)`` on every current member."""
        values: list[Any] = self._coord.call.call_one(method, args, kwargs).get(
            timeout=self._start_timeout
        )
        return values

    def add_hosts(self, hosts: Any) -> int:
        """Let replacements and spares go to ``hosts`` (a ``HostMesh``) too: a host that
        was lost and came back (its worker attached again) rejoins this way, as a place
        for new replicas; nothing of what ran there before resumes. Returns how many
        hosts the mesh may now use."""
        if not hasattr(hosts, "spawn_procs"):
            raise TypeError(f"hosts must be a HostMesh, got {hosts!r}")
        count: int = self._coord.add_hosts.call_one(hosts).get(timeout=self.timeout)
        return count

    def stats(self) -> ElasticStats:
        """Steps, losses, restarts, recoveries so far
        ([`ElasticStats`][danaus.elastic.ElasticStats])."""
        stats: ElasticStats = self._coord.get_stats.call_one().get(timeout=self.timeout)
        return stats

    def members(self) -> list[tuple[int, int]]:
        """(replica id, pid) of each current member, in rank order."""
        members: list[tuple[int, int]] = self._coord.members_info.call_one().get(
            timeout=self.timeout
        )
        return members

    def stop(self) -> None:
        """Stop the replicas, the spares and the coordinator."""
        try:
            self._coord.shutdown.call_one().get(timeout=self.timeout)
        finally:
            self._procs.stop().get(timeout=self.timeout)

    def __enter__(self) -> ElasticMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
