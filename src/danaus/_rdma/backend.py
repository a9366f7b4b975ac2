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

A backend is the interface `Backend`: ``register(memory)`` returns the
picklable descriptor a handle carries (``None`` for the built-in plane, whose
handle fields say everything); ``unregister(descriptor)`` ends it once no
transfer uses it (after ``drop()``); ``run(group)`` moves the bytes of a group
of operations on buffers of one owner. What every backend shares stays in
`Transfer`: argument checks, the deadline, the
owner's check and pin of its buffers (so a ``drop()`` waits for transfers under
way and later ones fail), and the owner's loss, which fails the transfer at once.

The setting ``rdma_backend`` chooses: ``"builtin"`` (the default), ``"nixl"``,
or ``"auto"`` (NIXL for CUDA memory where it is installed, the built-in plane
for CPU memory, whose one-kernel-copy path on a host NIXL does not beat). A
backend that cannot start in this process falls back to the built-in plane
with one log line naming why (``danaus.rdma`` logger): a WARNING when NIXL was
asked for by name, INFO under ``"auto"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .._runtime.node import Node
from .memory import LocalMemory

if TYPE_CHECKING:
    from .errors import RDMAError, RDMAOwnerLostError
    from .op import Op

__all__ = ["BACKENDS", "BUILTIN", "Backend", "Group", "device_of"]

BUILTIN = "builtin"
BACKENDS = ("auto", "builtin", "nixl")


@dataclass(frozen=True)
class Group:
    """The operations of one transfer on the buffers of one owner, and how to report.

    Handed to `Backend.run()` by the transfer; every callable is safe from any thread.
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


def device_of(memory: LocalMemory) -> tuple[str, int]:
    """``("cpu", 0)`` or ``("cuda", index)``: where ``memory`` lives.

    A tensor that keeps the memory alive says (its ``device``); else a record of GPU
    memory says so itself (``host`` False, ``device`` its index, an int or ``"cuda:1"``).
    """
    kept = getattr(memory.keepalive, "device", None)
    if getattr(kept, "type", None) == "cuda":
        return "cuda", int(getattr(kept, "index", None) or 0)
    if getattr(memory, "host", True) is not False:
        return "cpu", 0
    device = getattr(memory, "device", 0)
    if isinstance(device, int):
        return "cuda", device
    _, _, index = str(device).partition(":")
    return "cuda", int(index) if index.isdigit() else 0
