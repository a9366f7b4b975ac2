"""Monarch's ``monarch.common.device_mesh``: the active mesh of the tensor engine.

In danaus a ``ProcMesh`` is the tensor engine's mesh (``with procs.activate():``);
``procs.process_group(dims)`` makes its ``RemoteProcessGroup``. ``DeviceMesh``
here is Monarch's device mesh built over a ``Client`` (``DeviceMesh(client,
processes, names)``): the mesh algebra a ``ProcMesh`` has, over ranks alone,
without processes to run tensors on.
"""

from __future__ import annotations

from typing import Any

from .._mesh import MeshTrait, Shape, Slice
from .._tensor.active import get_active_mesh, no_mesh
from .._tensor.groups import RemoteProcessGroup

__all__ = ["DeviceMesh", "RemoteProcessGroup", "get_active_mesh", "no_mesh"]


class DeviceMesh(MeshTrait):
    """Monarch's ``DeviceMesh(client, processes, names)``: the ranks ``processes`` (an
    ``NDSlice``), one dimension per name, on ``client``.

    ``dm(a=0, b=slice(None, None, 2))`` and ``slice``, ``split``, ``rename``,
    ``flatten``, ``size`` are a ``ProcMesh``'s (the same code and errors);
    ``processes`` and ``names`` give the result. It has no processes:
    ``activate()`` raises ``NotImplementedError`` naming what runs tensor programs.
    """

    def __init__(self, client: Any, processes: Slice, names: Any) -> None:
        self.client = client
        self._sh = Shape(list(names), processes)

    @property
    def _shape(self) -> Shape:
        return self._sh

    def _new_with_shape(self, shape: Shape) -> DeviceMesh:
        return DeviceMesh(self.client, shape.ndslice, tuple(shape.labels))

    @property
    def processes(self) -> Slice:
        """The ranks, as an ``NDSlice`` of global ranks."""
        return self._sh.ndslice

    @property
    def names(self) -> tuple[str, ...]:
        """The dimension names, outermost first."""
        return tuple(self._sh.labels)

    def __call__(self, **dims: Any) -> DeviceMesh:
        """``dm(host=0)``: ``dm.slice(host=0)`` (Monarch's device-mesh call)."""
        return self.slice(**dims)

    def activate(self) -> Any:
        raise NotImplementedError(
            "a DeviceMesh built over a Client has no processes to run tensor programs on; "
            "activate a ProcMesh (this_host().spawn_procs(...).activate()) or "
            "danaus.Simulator(...).mesh"
        )

    def __repr__(self) -> str:
        return f"<DeviceMesh(names({self.names}), processes({list(self.processes)}))>"
