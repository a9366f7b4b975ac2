"""Elastic data parallelism: training that keeps going when a replica is lost.

``ElasticReplica`` (replica.py) is the base of one data-parallel replica: it
runs the user's ``train_step`` and ``commit`` and does its collectives on the
process group of the current membership. ``ElasticCoordinator``
(coordinator.py), an actor in a proc of its own, owns the replicas: it learns
of a lost one through supervision, aborts the step in flight, re-forms the
process group at the smaller size, retries the step there, and admits a
replacement at a step boundary after it copied the state of a healthy replica
over ``RDMABuffer``. ``ElasticMesh`` (mesh.py) is the client's handle.

torch is imported only inside functions: importing this layer never loads it.

Imports: ``_errors``, ``_actor``, ``_rdma``, ``_tensor.rendezvous`` (the
rendezvous store the memberships' process groups meet through, an actor; it
imports torch only when a member makes its side of the store), ``_job`` (the
network environment of ``danaus.spmd``).
"""
