"""Elastic data parallelism: training that keeps going when a replica is lost.

::

    from danaus.elastic import ElasticMesh, ElasticReplica

    class Trainer(ElasticReplica):
        def train_step(self, step):   # gradients of this member's share, all_reduce'd
            ...
        def commit(self, step):       # optimizer.step()
            ...
        def state(self):              # what a replacement copies from a healthy replica
            ...

    mesh = ElasticMesh(Trainer, replicas=4, spares=1)
    for k in range(steps):
        world, values = mesh.step(k)

See ``docs/fault-tolerance.md`` ("Training that survives a lost rank").
"""

from __future__ import annotations

from ._elastic.coordinator import ElasticStats as ElasticStats
from ._elastic.mesh import ElasticMesh as ElasticMesh
from ._elastic.replica import ElasticReplica as ElasticReplica
from ._elastic.replica import Membership as Membership
from ._elastic.replica import MembershipChanged as MembershipChanged

__all__ = ["ElasticMesh", "ElasticReplica", "ElasticStats", "Membership", "MembershipChanged"]
