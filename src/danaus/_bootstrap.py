"""The one bootstrap: installs every subsystem on a new node, explicitly, in order.

``danaus._runtime.node`` calls `install()` when a process's node starts
(the client's on first use, a proc's in ``proc_main``). Nothing in danaus
installs itself on import: what a node serves does not depend on which
modules happened to be imported first. The zygote preloads this module, so
forked procs start with every subsystem imported.
"""

from __future__ import annotations

import functools
from typing import Any, cast

from ._actor.api import procs
from ._actor.api.extensions import Extensions, TensorEngine
from ._actor.core import procservice, telemetry, undeliverable
from ._actor.tools import introspect
from ._rdma import net as rdma
from ._runtime.logs import process as logs
from ._runtime.node import Node
from ._supervision import monitor

__all__ = ["INSTALLERS", "PRELOAD", "install"]


# The imports inside the functions below are the deliberate ones: each loads a
# layer on its first use only. The tensor engine imports torch, an optional
# dependency, so `import danaus` and a node's start must not; the dashboard (its
# HTTP server, ~30 ms of imports) loads when DANAUS_DASHBOARD=1 asks for it; the
# debugger's proc side (pdb) is for spawned procs only, where the zygote preloaded it.


def _tensor_engine() -> TensorEngine:
    from ._tensor import api

    # api re-exports actor_rref for Endpoint.rref outside its __all__ (a public name list).
    return cast(TensorEngine, api)


def _serve_dashboard(node: Node) -> None:
    from ._observe import dashboard

    dashboard.serve_from_environment(node)


def _dashboard_url(node: Node) -> str | None:
    from ._observe import dashboard

    dash = dashboard.serve_from_environment(node)
    return dash.url if dash is not None else None


def _query_engine_client(node: Node) -> Any:
    from ._observe import sql

    return sql.QueryEngineClient(node)


def _start_history(node: Node, retention_s: float, snapshot_s: float) -> Any:
    from ._observe import history

    return history.start(node, retention_s, snapshot_s)


def _install_debugger(node: Node, boot: dict[str, Any]) -> None:
    """Route actors' ``breakpoint()`` to the client (spawned procs only)."""
    if not boot:
        return  # the client keeps Python's own hooks, and never imports pdb
    from ._actor.debugger import remote

    remote.install(node, boot)


def _install_extensions(node: Node, boot: dict[str, Any]) -> None:
    """What the layers above the actor API add to it (``_actor/api/extensions.py``)."""
    ext = node.part(Extensions)
    ext.tensor_engine = _tensor_engine
    # Each is handed the node it serves: what it starts belongs to this node's client.
    ext.serve_dashboard = functools.partial(_serve_dashboard, node)
    ext.dashboard_url = functools.partial(_dashboard_url, node)
    ext.query_engine_client = functools.partial(_query_engine_client, node)
    ext.start_history = functools.partial(_start_history, node)


#: Each subsystem's installer, in the order they run: ``installer(node, boot)``.
#: An installer registers frame handlers and hooks through the runtime's methods and
#: keeps its state in a part of the node; it never sets attributes on the runtime.
INSTALLERS = (
    ("logs", logs.install),  # output and logging records reach the client; LOG_* frames
    ("procs", procservice.install),  # STOP_PROC, spawning actors in this proc
    ("proc meshes", procs.install),  # context().actor_instance.proc
    ("extensions", _install_extensions),  # the tensor engine and the dashboard, on first use
    ("undeliverable", undeliverable.install),  # BOUNCE: messages that could not be delivered
    ("supervision", monitor.install),  # FAILED, and lost peers failing their meshes
    ("rdma", rdma.install),  # RDMA_CHECK / RDMA_DROP / RDMA_DATA
    ("introspect", introspect.install),  # STATS, TRACE_START/STOP, STACK (dashboard, trace)
    ("debugger", _install_debugger),  # breakpoint() in an actor talks to the client
    ("telemetry", telemetry.install),  # a proc spawned with telemetry on turns it on
)


#: Modules the zygote imports besides this one, so that forked procs get them for free.
#: Every danaus module a proc uses must be here or imported by this module: one that
#: a proc imports after its fork costs that CPU in every proc (importing danaus.actor
#: there took ~60 ms a proc, 4x the time of a spawn of 4). danaus.actor: unpickling
#: an actor's class imports it; the debugger (pdb alone costs ~10 ms; the client does
#: not import it).
PRELOAD = ("danaus.actor", "danaus._actor.debugger.remote")


def install(node: Node, boot: dict[str, Any]) -> None:
    """Install every subsystem on ``node``: its frame handlers, hooks and parts."""
    for _name, installer in INSTALLERS:
        installer(node, boot)
