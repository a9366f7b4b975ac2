"""The observing names of the top-level ``danaus`` facade: ``trace`` and ``stats``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._actor.api.mesh import ActorMesh
from .._actor.api.procs import ProcMesh
from .._actor.api.stats import MeshStats, mesh_stats
from .._actor.core.future import Future
from .trace import Trace, trace

if TYPE_CHECKING:
    from .._actor.api.mesh import ActorMesh
    from .._actor.api.procs import ProcMesh

__all__ = ["MeshStats", "Trace", "stats", "trace"]


def stats(mesh: ActorMesh[Any] | ProcMesh) -> Future[MeshStats]:
    """The metrics of an actor mesh (its endpoints, per actor) or a proc mesh (all actors).

    Does not block: ``danaus.stats(trainer).get().endpoints["step"].p99_s``.
    ``endpoints`` maps each endpoint to calls, errors and latency percentiles
    (merged over the actors asked), ``actors`` has the same per actor, and
    ``procs`` each proc's connections (bytes and frames) or why it did not
    answer within the ``stats_timeout`` setting. Raises ``TypeError`` for
    anything but a mesh.
    """
    if isinstance(mesh, ProcMesh):
        return mesh.stats()
    if isinstance(mesh, ActorMesh):
        ranks = mesh._shape.ranks()
        procs = [mesh._ref.procs[r] for r in ranks]
        cf = mesh_stats(mesh._node().runtime, procs, mesh._ref.mesh_id, ranks)
        return Future._create(cf, f"the statistics of actor mesh {mesh._ref.name!r}")
    raise TypeError(
        f"danaus.stats() takes an ActorMesh or a ProcMesh, got {mesh!r}; e.g. "
        "danaus.stats(procs.spawn('trainer', Trainer)).get()"
    )
