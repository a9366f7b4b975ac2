"""Supervision layer: failures become ``MeshFailure`` events delivered to the owner.

Failure paths into this layer, all in the owner's process:

    FAILED frame from a failing actor (exception with no reply, BaseException,
        failed __init__, abort(), declined or raising __supervise__)
    the runtime losing a proc (EOF, refused connection, host agent's exit report)

Each becomes one ``MeshFailure`` per failed rank, given to the owning actor's
``__supervise__`` (on its own thread, between messages) or, for the client,
to ``danaus.actor.unhandled_fault_hook``.

Imports: ``_errors``, ``_mesh``, ``_wire``, ``_transport``, ``_runtime``, ``_actor``.
"""

from . import monitor as _monitor  # noqa: F401  (installs the handlers)
