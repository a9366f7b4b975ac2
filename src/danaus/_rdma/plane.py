"""The backends started in this process, and the choice of one for memory registered now.

See ``backend.py`` for the seam itself. This module starts backends (NIXL on first
use, once per process: a failure is logged once and the built-in plane serves) and
applies the setting ``rdma_backend``.
"""

from __future__ import annotations

import logging
import threading

from .. import _config as config
from .._runtime.node import Node
from . import nixl
from .backend import BACKENDS, BUILTIN, Backend, device_of
from .memory import LocalMemory

__all__ = ["Plane", "choose", "for_name"]

log = logging.getLogger("danaus.rdma")


class Plane:
    """The backends started in this process (a node part): at most one start try each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _started
        self._started: dict[str, Backend | None] = {}

    def backend(self, name: str, node: Node, *, asked: bool) -> Backend | None:
        """The backend ``name`` if it runs here (started on first use), else None.

        The first failure to start is logged once, as a WARNING when the backend was
        ``asked`` for by name (``rdma_backend="nixl"``), else as INFO.
        """
        with self._lock:
            if name in self._started:
                return self._started[name]
            started: Backend | None = None
            try:
                started = _start(name, node)
            except Exception as e:
                level = logging.WARNING if asked else logging.INFO
                log.log(
                    level,
                    "RDMA backend %r cannot start in proc %s (%s); buffers registered here "
                    "use the built-in data plane instead",
                    name,
                    node.runtime.proc_id.name,
                    _why(e),
                )
            self._started[name] = started
            return started

    def get(self, name: str) -> Backend | None:
        """The backend ``name`` if it has started here (never starts one)."""
        with self._lock:
            return self._started.get(name)

    def on_node_end(self) -> None:
        with self._lock:
            started, self._started = self._started, {}
        for backend in started.values():
            end = getattr(backend, "close", None)
            if end is not None:
                end()


def _why(e: BaseException) -> str:
    if isinstance(e, ImportError):
        return f"{e}; install it with pip install 'danaus[nixl]'"
    return f"{type(e).__name__}: {e}"


def _start(name: str, node: Node) -> Backend:
    if name == "nixl":
        return nixl.NixlBackend(node)
    raise ValueError(f"unknown RDMA backend {name!r}")  # pragma: no cover - checked before


def choose(memory: LocalMemory, node: Node) -> Backend | None:
    """The backend for memory registered now, per ``rdma_backend``; None: the built-in plane.

    Raises ``ValueError`` for a setting that names no backend.
    """
    wanted = config.get("rdma_backend")
    if wanted not in BACKENDS:
        raise ValueError(
            f"the setting rdma_backend is {wanted!r}; it must be one of {list(BACKENDS)} "
            "(DANAUS_RDMA_BACKEND, or danaus.config.configure(rdma_backend=...))"
        )
    if wanted == BUILTIN:
        return None
    if wanted == "auto" and device_of(memory)[0] == "cpu":
        return None
    return node.part(Plane).backend("nixl", node, asked=wanted == "nixl")


def for_name(name: str, node: Node) -> Backend:
    """The started backend a handle names, for a transfer from this process.

    A process that reads or writes a NIXL buffer needs a NIXL agent of its own: it is
    started here on first use. Raises ``RuntimeError`` naming why if it cannot start.
    """
    plane = node.part(Plane)
    backend = plane.get(name)
    if backend is not None:
        return backend
    backend = plane.backend(name, node, asked=True)
    if backend is None:
        raise RuntimeError(
            f"this buffer is moved by the RDMA backend {name!r}, which cannot start in this "
            f"process (proc {node.runtime.proc_id.name}; see the log line above for why). "
            "Install it here too (pip install 'danaus[nixl]'), or have the owner register "
            "the memory with rdma_backend='builtin'"
        )
    return backend
