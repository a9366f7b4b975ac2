"""Monarch's ``monarch.common.client``: ``Client``, the tensor engine's side of a controller.

danaus's tensor engine has no controller: a ``ProcMesh``'s engine sends its
commands to the worker actors itself (``docs/tensor.md``). ``Client`` here is
the part of Monarch's that needs none of that: it carries Monarch's messages
(``danaus.common.messages``) to a controller object given to it (Monarch's
interface: ``send(ranks, msg)``, and where it has them ``drain_and_stop()``,
``stop_mesh()``, ``drop_refs(refs)``), numbers references and shuts down. With
``danaus.simulator.mock_controller.MockController`` and
``danaus.common.device_mesh.DeviceMesh`` it gives Monarch's device-mesh algebra
without processes, as Monarch's own tests use it. Monarch's tensor operations
through a ``Client`` (``fetch``, ``new_node``, borrows, recordings) are its
controller protocol and raise ``AttributeError`` naming what to use instead.
"""

from __future__ import annotations

import itertools
from typing import Any

from .._mesh import Slice
from . import messages

__all__ = ["Client"]


class Client:
    """A client of ``controller`` over ``world_size`` ranks, ``gpu_per_host`` a host."""

    def __init__(self, controller: Any, world_size: int, gpu_per_host: int) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"Client: world_size must be an int >= 1, got {world_size!r}")
        self.inner = controller
        self._world_size = world_size
        self._gpu_per_host = gpu_per_host
        self.next_ref = itertools.count()
        self._shutdown = False

    @property
    def all_ranks(self) -> Slice:
        """Every rank, ``NDSlice(offset=0, sizes=[world_size], strides=[1])``."""
        return Slice(0, [self._world_size], [1])

    @property
    def gpu_per_host(self) -> int:
        return self._gpu_per_host

    @property
    def has_shutdown(self) -> bool:
        return self._shutdown

    def new_ref(self) -> int:
        """A new reference number (0, 1, 2, ...)."""
        return next(self.next_ref)

    def send(self, ranks: Any, msg: Any) -> None:
        """Hand ``msg`` for ``ranks`` to the controller. Raises ``RuntimeError`` once shut
        down."""
        if self._shutdown:
            raise RuntimeError(
                f"this Client has shut down; {type(msg).__name__} was not sent. Make a new "
                "Client for a new controller"
            )
        self.inner.send(ranks, msg)

    def send_nocoalesce(self, ranks: Any, msg: Any) -> None:
        self.send(ranks, msg)

    def handle_deletes(self, ranks: Any, refs: list[int], coalesce: bool = True) -> None:
        """Send ``DeleteRefs(refs)`` and tell the controller they are gone."""
        self.send(ranks, messages.DeleteRefs(refs))
        drop = getattr(self.inner, "drop_refs", None)
        if drop is not None:
            drop(refs)

    def shutdown(self, destroy_pg: bool = True, error_reason: BaseException | None = None) -> None:
        """Send ``Exit`` to every rank and stop the controller. Idempotent."""
        if self._shutdown:
            return
        self.send(self.all_ranks, messages.Exit(destroy_pg, error_reason))
        self._shutdown = True
        drain = getattr(self.inner, "drain_and_stop", None)
        if drain is not None:
            drain()
        stop = getattr(self.inner, "stop_mesh", None)
        if stop is not None:
            stop()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"Client.{name}: this is Monarch's tensor-engine controller protocol (tensor "
            "operations, fetches, borrows, recordings), which danaus does not have: its "
            "tensor engine sends commands to the worker actors itself. Run tensor programs "
            "on a ProcMesh (`with procs.activate():`) or on danaus.Simulator(...).mesh"
        )

    def __repr__(self) -> str:
        state = ", shut down" if self._shutdown else ""
        return f"<Client of {self.inner!r}, {self._world_size} ranks{state}>"
