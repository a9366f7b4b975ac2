"""Actors and fixtures for the RDMA tests.

``Holder`` registers buffers of random bytes (never zeros, so a transfer that
moved nothing cannot pass) and reads, writes and relays handles. ``Parent``
spawns a child proc holding one buffer and supervises it (``__supervise__``
returns True), so tests may kill that child without the failure reaching the
test process. Cross-process waits never sleep: a gate is a module-global
``threading.Event`` in the proc, set by a *different* actor of that proc.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from danaus.actor import Actor, ActorMesh, ProcMesh, endpoint, this_host
from danaus.rdma import RDMABuffer

REPLY_TIMEOUT = 30.0  # far above what any healthy call here needs

_GATES: dict[str, threading.Event] = {}
_GATES_LOCK = threading.Lock()


def gate(key: str) -> threading.Event:
    with _GATES_LOCK:
        return _GATES.setdefault(key, threading.Event())


def random_bytes(n: int, seed: int) -> np.ndarray:
    """``n`` random bytes in 1..255 (never zero)."""
    return np.random.default_rng(seed).integers(1, 256, n, dtype=np.uint8)


def make_data(kind: str, n: int, seed: int) -> Any:
    arr = random_bytes(n, seed)
    if kind == "numpy":
        return arr
    if kind == "bytearray":
        return bytearray(arr.tobytes())
    if kind == "bytes":
        return arr.tobytes()
    if kind == "torch":
        import torch

        return torch.from_numpy(arr.copy())
    raise ValueError(kind)


def as_bytes(data: Any) -> bytes:
    if type(data).__module__.startswith("torch"):
        return bytes(data.numpy().tobytes())
    return bytes(memoryview(data).cast("B"))


class Holder(Actor):
    """Owns named buffers; reads and writes buffers it is handed."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[Any, RDMABuffer]] = {}

    @endpoint
    def make(self, name: str, n: int, kind: str = "numpy", seed: int = 0) -> RDMABuffer:
        data = make_data(kind, n, seed)
        buf = RDMABuffer(data)
        self.items[name] = (data, buf)
        return buf

    @endpoint
    def fill(self, name: str, n: int, value: int) -> RDMABuffer:
        data = np.full(n, value, dtype=np.uint8)
        buf = RDMABuffer(data)
        self.items[name] = (data, buf)
        return buf

    @endpoint
    def contents(self, name: str) -> bytes:
        return as_bytes(self.items[name][0])

    @endpoint
    def digest(self, name: str) -> str:
        import hashlib

        return hashlib.sha256(memoryview(self.items[name][0]).cast("B")).hexdigest()

    @endpoint
    def read(self, buf: RDMABuffer, extra: int = 0) -> bytes:
        dst = bytearray(buf.size() + extra)
        buf.read_into(dst, timeout=REPLY_TIMEOUT).get(timeout=REPLY_TIMEOUT)
        return bytes(dst)

    @endpoint
    def write(self, buf: RDMABuffer, data: bytes) -> None:
        buf.write_from(data, timeout=REPLY_TIMEOUT).get(timeout=REPLY_TIMEOUT)

    @endpoint
    def relay_read(self, reader: ActorMesh[Holder], buf: RDMABuffer) -> bytes:
        """Hand ``buf`` on to ``reader`` (another actor), which reads it."""
        result: bytes = reader.read.call_one(buf).get(timeout=REPLY_TIMEOUT)
        return result

    @endpoint
    def drop(self, buf: RDMABuffer) -> None:
        buf.drop().get(timeout=REPLY_TIMEOUT)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def block(self, key: str) -> bool:
        """Busy this actor until another actor of the proc calls ``release(key)``."""
        gate(key + ".entered").set()
        return gate(key).wait(REPLY_TIMEOUT)

    @endpoint
    def wait_entered(self, key: str) -> bool:
        return gate(key + ".entered").wait(REPLY_TIMEOUT)

    @endpoint
    def release(self, key: str) -> None:
        gate(key).set()


class AsyncReader(Actor):
    """An async actor that awaits RDMA futures inside its endpoints."""

    @endpoint
    async def read(self, buf: RDMABuffer) -> bytes:
        dst = bytearray(buf.size())
        await buf.read_into(dst, timeout=REPLY_TIMEOUT)
        return bytes(dst)


class Parent(Actor):
    """Spawns child procs holding one buffer each and absorbs their failures."""

    def __init__(self) -> None:
        self.children: list[tuple[ProcMesh, ActorMesh[Holder]]] = []
        self.failures: list[str] = []

    @endpoint
    def spawn_child(self, n: int, value: int) -> tuple[RDMABuffer, int]:
        pm = this_host().spawn_procs(per_host={"c": 1})
        holder = pm.spawn("child", Holder)
        buf = holder.fill.call_one("big", n, value).get(timeout=REPLY_TIMEOUT)
        pid = holder.pid.call_one().get(timeout=REPLY_TIMEOUT)
        self.children.append((pm, holder))
        return buf, pid

    def __supervise__(self, failure: Any) -> bool:
        self.failures.append(str(failure))
        return True


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    """Two procs, ``{"x": 2}``, shared by the tests of one module."""
    pm = this_host().spawn_procs(per_host={"x": 2})
    assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def holders(procs: ProcMesh) -> ActorMesh[Holder]:
    mesh = procs.spawn("holders", Holder)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    return mesh


@pytest.fixture(scope="module")
def gates(procs: ProcMesh) -> ActorMesh[Holder]:
    """A second mesh on the same procs: it releases the gates ``holders`` wait on."""
    mesh = procs.spawn("gates", Holder)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    return mesh


def started(fut: Any) -> Any:
    """``fut``, started: a transfer starts when first waited for (Monarch's rule), and a
    wait of 0 seconds starts it without blocking."""
    try:
        fut.get(timeout=0)
    except Exception:  # still running (TimeoutError), or failed: the future keeps its outcome
        pass
    return fut
