"""The client side of one proc mesh's tensor engine: its workers, ids and command stream.

One ``Engine`` per spawned proc mesh (shared by its slices), made at first
activation. It spawns one ``TensorWorker`` per proc on a flat view of all
the mesh's procs, so a worker's global rank is its proc's index in the mesh,
the same numbering every slice's ``Shape`` uses. Commands go out at once, in
the order they are issued, with ``broadcast`` (per-sender FIFO keeps them in
order with each other and with later fetches); the client never waits for
a worker. The engine also starts the ``TCPStore`` the workers' process
groups meet through.

    client ── run([cmds]) ──▶ worker r  (one per proc; refs: id -> tensor | Failure)
           ◀─ fetch(ids) ───
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch
import torch.distributed as dist

from .._actor.procs import ProcMesh
from .._mesh import Shape, Slice
from .messages import Delete
from .worker import TensorWorker

__all__ = ["Engine", "engine_for"]

# Process groups give up on a peer after this long (a dead peer is seen sooner by supervision).
COLLECTIVE_TIMEOUT_S = 300.0

_create_lock = threading.Lock()


class Engine:
    """The tensor-engine workers of one proc mesh and the client's bookkeeping for them."""

    def __init__(self, mesh: ProcMesh) -> None:
        procs = mesh._procs
        n = len(procs)
        # The store that process groups rendezvous through; workers connect as clients.
        self.store = dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True
        )
        flat = ProcMesh(procs, Shape(["rank"], Slice.new_row_major([n])), mesh._state, None)
        self.workers = flat._spawn(
            "tensor_engine",
            TensorWorker,
            ("127.0.0.1", self.store.port, COLLECTIVE_TIMEOUT_S),
            {},
            None,
        )
        self.device = torch.device("cpu")
        self.size = n
        self._ids = itertools.count(1)
        self._dead: list[int] = []
        self._lock = threading.Lock()
        self._targets: dict[Shape, Any] = {}

    def new_id(self) -> int:
        return next(self._ids)

    def release(self, ref: int) -> None:
        """A handle was collected: its id goes to the workers with the next command."""
        self._dead.append(ref)  # list.append is atomic; may run in a GC callback

    def targets(self, shape: Shape) -> Any:
        """The worker actors of the procs in ``shape`` (a mesh of this engine)."""
        t = self._targets.get(shape)
        if t is None:
            t = self._targets[shape] = self.workers._new_with_shape(shape)
        return t

    def send(self, shape: Shape, *cmds: Any) -> None:
        """Send ``cmds`` to the workers of ``shape`` now, in order; never waits."""
        with self._lock:
            batch = list(cmds)
            if self._dead:
                dead, self._dead = self._dead, []
                if len(shape) == self.size:
                    batch.insert(0, Delete(tuple(dead)))
                else:
                    self.workers.run.broadcast([Delete(tuple(dead))])
            self.targets(shape).run.broadcast(batch)

    def flush(self) -> None:
        """Send pending deletions now (so a following query sees them)."""
        with self._lock:
            if self._dead:
                dead, self._dead = self._dead, []
                self.workers.run.broadcast([Delete(tuple(dead))])


def engine_for(mesh: Any) -> Engine:
    """The engine of ``mesh``'s procs, spawning its workers at first use. Does not block.

    Raises ``TypeError`` if ``mesh`` is not a ``ProcMesh``.
    """
    if not isinstance(mesh, ProcMesh):
        raise TypeError(
            f"expected a ProcMesh (from this_host().spawn_procs(...)), got {mesh!r}; "
            "tensors live on proc meshes"
        )
    state = mesh._state
    engine = state.tensor_engine
    if engine is None:
        with _create_lock:
            engine = state.tensor_engine
            if engine is None:
                engine = state.tensor_engine = Engine(mesh)
    return engine  # type: ignore[no-any-return]
