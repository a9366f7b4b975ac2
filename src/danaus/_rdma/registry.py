"""This process's registered memory, and the runtime handlers that answer for it.

A buffer's owner keeps ``id -> Registration`` here until ``drop()``. Other
processes ask the owner's *runtime* (its I/O thread, never an actor thread)
whether their handles are still good, just before each transfer::

    reader --RDMA_CHECK(ids, port, 0)--> owner   I/O thread looks the ids up
    owner  --REPLY(port, 0, [None | why, ...])--> reader
    anyone --RDMA_DROP(ids, port, 0)--> owner    forgets the ids (the data is released)
    owner  --REPLY(port, 0, None)--> anyone

Across hosts the owner's data threads look the ids up here too (``net.py``,
which also answers ``RDMA_DATA``: where its data server listens).

Buffer ids count up from 1 in each process and are never reused, so a
handle to a dropped buffer can never name a later one.
"""

from __future__ import annotations

import threading
from typing import Any

from .._runtime.runtime import STATUS_OK, Runtime
from .._wire.protocol import Kind, Message
from .memory import LocalMemory

__all__ = [
    "Registration",
    "check",
    "drop",
    "install",
    "lookup",
    "register",
]


class Registration:
    """Registered memory: where it is, and the object that keeps it alive."""

    __slots__ = ("addr", "memory", "nbytes", "readonly")

    def __init__(self, memory: LocalMemory) -> None:
        self.memory = memory
        self.addr = memory.addr
        self.nbytes = memory.nbytes
        self.readonly = memory.readonly


_lock = threading.Lock()
_next_id = 1  # ids count up and are never reused
_registered: dict[int, Registration] = {}


def register(memory: LocalMemory) -> int:
    """Keep ``memory`` alive and reachable under a new id; returns the id."""
    global _next_id
    with _lock:
        buffer_id = _next_id
        _next_id += 1
        _registered[buffer_id] = Registration(memory)
    return buffer_id


def check(buffer_id: int, addr: int, nbytes: int) -> str | None:
    """None if ``buffer_id`` is registered here as ``(addr, nbytes)``, else why not."""
    return lookup(buffer_id, addr, nbytes)[1]


def lookup(buffer_id: int, addr: int, nbytes: int) -> tuple[Registration | None, str | None]:
    """``(registration, None)`` if ``buffer_id`` is registered here as ``(addr, nbytes)``.

    Otherwise ``(None, why not)``. Holding the registration keeps its memory
    alive, even if the buffer is dropped meanwhile.
    """
    with _lock:
        reg = _registered.get(buffer_id)
        issued = buffer_id < _next_id
    if reg is None:
        return None, "it was dropped" if issued else "it is not registered"
    if reg.addr != addr or reg.nbytes != nbytes:  # pragma: no cover - ids are never reused
        return None, "its registration does not match the handle"
    return reg, None


def drop(buffer_ids: list[int]) -> None:
    """Forget ``buffer_ids`` (unknown ids are ignored): their memory is no longer held."""
    with _lock:
        for buffer_id in buffer_ids:
            _registered.pop(buffer_id, None)


def registered_count() -> int:
    """How many buffers this process has registered and not dropped."""
    with _lock:
        return len(_registered)


def registered_buffers() -> list[dict[str, Any]]:
    """The buffers registered here, as plain data (for STATS snapshots and the dashboard)."""
    with _lock:
        regs = list(_registered.items())
    return [{"id": i, "nbytes": r.nbytes, "readonly": r.readonly} for i, r in regs]


# -- the runtime side: answered on the I/O thread ----------------------------------


def install(rt: Runtime, boot: dict[str, Any] | None = None) -> None:
    """Register the RDMA frame handlers on ``rt`` (idempotent)."""
    if rt.handlers.get(Kind.RDMA_CHECK) is None:
        rt.register(Kind.RDMA_CHECK, lambda conn, msg: _on_check(rt, msg))
        rt.register(Kind.RDMA_DROP, lambda conn, msg: _on_drop(rt, msg))
        rt.observers["rdma"] = registered_buffers
    from . import net  # here, not at the top: net imports this module

    net.install(rt)


def _on_check(rt: Runtime, frame: Message) -> None:
    entries, port, index = frame.header
    answers = [check(buffer_id, addr, nbytes) for buffer_id, addr, nbytes in entries]
    rt.reply(port, index, STATUS_OK, answers)


def _on_drop(rt: Runtime, frame: Message) -> None:
    buffer_ids, port, index = frame.header
    drop(list(buffer_ids))
    if port is not None:
        rt.reply(port, index, STATUS_OK, None)
