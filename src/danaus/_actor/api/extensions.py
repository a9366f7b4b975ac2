"""What layers above the actor API add to it: the tensor engine and the dashboard.

``ProcMesh.activate()``/``rank()`` and ``Endpoint.rref()`` hand over to the
tensor engine, and the first spawn with ``DANAUS_DASHBOARD=1`` starts the
dashboard; both live in higher layers (the engine needs torch, an optional
extra), so this layer never imports them. The bootstrap, above every layer,
fills in an `Extensions` part on each node it installs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..._runtime.node import Node

__all__ = ["Extensions", "TensorEngine", "tensor_engine"]


class TensorEngine(Protocol):
    """What the actor API calls of the tensor engine (``danaus._tensor.api``)."""

    def activate(self, mesh: Any) -> Any: ...

    def deactivate(self, mesh: Any) -> None: ...

    def mesh_rank(self, mesh: Any, dims: Any) -> Any: ...

    def mesh_ranks(self, mesh: Any) -> Any: ...

    def process_group(self, mesh: Any, dims: Any) -> Any: ...

    def actor_rref(self, endpoint: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...


class Extensions:
    """The higher layers' hooks into the actor API (a part of the node; the bootstrap
    sets them)."""

    def __init__(self) -> None:
        # Loads the tensor engine on first use (importing it imports torch).
        self.tensor_engine: Callable[[], TensorEngine] | None = None
        # Starts the dashboard once; called before a spawn when the setting is on.
        self.serve_dashboard: Callable[[], None] | None = None
        # For a job's telemetry (``_job/telemetry.py``): the running dashboard's URL
        # (started now if the setting is on; None when it is off), and a client with
        # Monarch's ``query(sql)`` over the telemetry tables.
        self.dashboard_url: Callable[[], str | None] | None = None
        self.query_engine_client: Callable[[], Any] | None = None
        # Keeps the telemetry tables in the job directory (retention_secs, snapshot_interval_secs).
        self.start_history: Callable[[float, float], Any] | None = None


def tensor_engine(node: Node) -> TensorEngine:
    """The tensor engine, as installed on ``node`` (a mesh's), loaded on first use."""
    load = node.part(Extensions).tensor_engine
    if load is None:
        raise RuntimeError(
            "the tensor engine is not installed on this node (danaus._bootstrap installs it)"
        )
    return load()
