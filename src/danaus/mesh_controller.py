"""Monarch's ``monarch.mesh_controller``: ``spawn_tensor_engine`` and ``RemoteException``.

In danaus a ``ProcMesh`` is itself the tensor engine's mesh (``with
procs.activate():``), so ``spawn_tensor_engine(procs)`` starts the engine's
workers on ``procs`` and returns a mesh that behaves as that ``ProcMesh``
(``activate``, ``slice``, ``flatten``, ``rank``, ...) plus Monarch's
``exit()``, which ends the engine (its workers and its client-side state) and
leaves the procs running: a later ``activate()`` starts a fresh engine.
``RemoteException`` is the error a remote function's failure raises when its
result is fetched (``danaus.RemoteTensorError``). Needs torch.
"""

from __future__ import annotations

from typing import Any

from ._actor.api.procs import ProcMesh
from ._tensor.engine import engine_for
from ._tensor.errors import RemoteTensorError

__all__ = ["DeviceMesh", "RemoteException", "spawn_tensor_engine"]

RemoteException = RemoteTensorError


class DeviceMesh:
    """The mesh ``spawn_tensor_engine`` returns: its ``ProcMesh``, plus ``exit()``."""

    __slots__ = ("_procs",)

    def __init__(self, procs: ProcMesh) -> None:
        self._procs = procs

    def exit(self, error: BaseException | None = None) -> None:
        """End the tensor engine on these procs (the procs keep running). Idempotent;
        ``error`` is accepted for Monarch's signature and not used."""
        state = self._procs._state
        engine, state.tensor_engine = state.tensor_engine, None
        if engine is not None:
            engine.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._procs, name)

    def __repr__(self) -> str:
        return f"DeviceMesh({self._procs!r})"


def spawn_tensor_engine(proc_mesh: ProcMesh) -> DeviceMesh:
    """Start the tensor engine's workers on ``proc_mesh`` (does not wait for them) and
    return its device mesh. ``TypeError`` if ``proc_mesh`` is not a ``ProcMesh``;
    ``RuntimeError`` if it was stopped."""
    engine_for(proc_mesh)
    return DeviceMesh(proc_mesh)
