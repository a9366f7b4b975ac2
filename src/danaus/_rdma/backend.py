"""The backend seam: which engine moves a buffer's bytes, chosen when the memory is registered.

Every ``RDMABuffer`` is moved by one backend, fixed by its owner at
registration (``RDMABuffer(data)``) and carried in its handle:

``builtin``
    danaus's own data plane, needing nothing installed: ``process_vm_readv`` /
    ``process_vm_writev`` between the processes of one host, an authenticated TCP
    data connection across hosts (``transfer.py``, ``net.py``).
``nixl``
    NVIDIA NIXL (``danaus[nixl]``; UCX underneath: shared memory and TCP between
    CPU processes, CUDA IPC / NVLink between the GPUs of a host, InfiniBand/RoCE
    with GPUDirect across hosts). Its agent metadata and the buffer's descriptor
    travel in the handle, on danaus's control plane; the bytes on NIXL's own
    transport (``nixl.py``).

A backend is the interface :class:`Backend`: ``register(memory)`` returns the
picklable descriptor a handle carries (``None`` for the built-in plane, whose
handle fields say everything); ``unregister(descriptor)`` ends it once no
transfer uses it (after ``drop()``); ``run(group)`` moves the bytes of a group
of operations on buffers of one owner. What every backend shares stays in
:class:`~danaus._rdma.transfer.Transfer`: argument checks, the deadline, the
owner's check and pin of its buffers (so a ``drop()`` waits for transfers under
way and later ones fail), and the owner's loss, which fails the transfer at once.

The setting ``rdma_backend`` chooses: ``"builtin"``, ``"nixl"``, or ``"auto"``
(the default: NIXL for CUDA memory where it is installed, the built-in plane
for CPU memory, whose one-kernel-copy path on a host NIXL cannot beat). A
backend that cannot start in this process falls back to the built-in plane
with one log line naming why (``danaus.rdma`` logger): a WARNING when NIXL was
asked for by name, INFO under ``"auto"``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .. import _config as config
from .._runtime.node import Node
from .memory import LocalMemory

if TYPE_CHECKING:
    from .errors import RDMAError, RDMAOwnerLostError
    from .transfer import Op

__all__ = [
    "BACKENDS",
    "BUILTIN",
    "Backend",
    "Group",
    "Plane",
    "choose",
    "device_of",
    "for_name",
]

log = logging.getLogger("danaus.rdma")

BUILTIN = "builtin"
BACKENDS = ("auto", "builtin", "nixl")


@dataclass(frozen=True)
class Group:
    """The operations of one transfer on the buffers of one owner, and how to report.

    Handed to :meth:`Backend.run` by the transfer; every callable is safe from any thread.
    ``finish()`` says the group is done (call it once, after the bytes moved and the
    owner's pin was released); ``fail(error)`` ends the whole transfer with ``error``
    (later calls are ignored); ``over()`` is True once the transfer has ended (failed,
    timed out, or another group failed): stop and clean up.
    """

    ops: list[Op]
    owner_is_me: bool  # the buffers are this process's own
    deadline: float  # time.monotonic() at which the transfer times out
    over: Callable[[], bool]
    fail: Callable[[BaseException], None]
    finish: Callable[[], None]
    on_end: Callable[[Callable[[], None]], None]  # call this when the transfer ends
    label: Callable[[Op], str]  # names an op in an error message
    unusable: Callable[[Op, str], RDMAError]  # the owner refused the buffer (dropped)
    owner_lost: Callable[[Op, str, BaseException | None], RDMAOwnerLostError]


class Backend(Protocol):
    """What moves the bytes of the buffers registered with it."""

    name: str

    def register(self, memory: LocalMemory) -> Any:
        """Register ``memory`` (kept alive by the caller); the picklable descriptor."""
        ...

    def unregister(self, descriptor: Any) -> None:
        """The buffer was dropped and no transfer uses it: release its registration."""
        ...

    def run(self, group: Group, node: Node) -> None:
        """Move the bytes of ``group`` (buffers registered with this backend). Returns at
        once; reports through ``group``."""
        ...


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
        from . import nixl

        return nixl.NixlBackend(node)
    raise ValueError(f"unknown RDMA backend {name!r}")  # pragma: no cover - checked before


def device_of(memory: LocalMemory) -> tuple[str, int]:
    """``("cpu", 0)`` or ``("cuda", index)``: where ``memory`` lives."""
    device = getattr(memory.keepalive, "device", None)
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        return "cuda", int(device.index or 0)
    return "cpu", 0


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
