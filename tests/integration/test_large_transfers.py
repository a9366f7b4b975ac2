"""A 1 GiB reply between procs of this host stalls neither heartbeats nor other
connections (issue 11 §2).

The reply's buffer is offloaded: the client's copier thread maps or copies it
out of the actor's memory while calls to another actor go on, and no peer is
declared lost. The same over TCP: ``tests/transport/test_large_frames.py``
(it attaches to a worker on loopback, so it runs after ``tests/multihost``).
"""

from __future__ import annotations

import gc
import os
import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from danaus._runtime import host
from danaus.actor import Actor, ProcMesh, endpoint, this_host

from .conftest import REPLY_TIMEOUT

GiB = 1 << 30


class Blob(Actor):
    @endpoint
    def blob(self, size: int) -> Any:
        data = bytearray(size)
        data[0], data[size // 2], data[-1] = 1, 2, 3
        return pickle.PickleBuffer(data)  # out of band: offloaded or sent as it is

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def echo(self, x: int) -> int:
        return x


def _check(value: Any, size: int) -> None:
    view = memoryview(value)
    assert view.nbytes == size
    assert (view[0], view[size // 2], view[-1]) == (1, 2, 3)
    assert view[1] == 0 and view[size - 2] == 0


def _lost_counter() -> list[str]:
    lost: list[str] = []
    rt = host.ensure_runtime()
    rt.lost_callbacks.append(lambda name, reason: lost.append(f"{name}: {reason}"))
    return lost


@pytest.fixture(scope="module")
def local() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(180)
def test_a_1gib_reply_between_procs_of_this_host_is_copied_off_the_io_loop(local) -> None:
    actors = local.spawn("large_local", Blob)
    sender, other = actors.slice(gpus=0), actors.slice(gpus=1)
    lost = _lost_counter()
    rt = host.ensure_runtime()
    copied = rt.offload.copied_off_loop
    big = sender.blob.call_one(GiB)
    answered = 0
    while not big.done():  # other calls go on while the reply is produced and copied
        assert other.echo.call_one(answered).get(timeout=REPLY_TIMEOUT) == answered
        answered += 1
    value = big.get(timeout=REPLY_TIMEOUT)
    _check(value, GiB)
    del value, big
    gc.collect()
    assert other.echo.call_one(-1).get(timeout=REPLY_TIMEOUT) == -1
    if rt.offload.enabled and rt.offload.ok_peers:
        assert rt.offload.copied_off_loop - copied >= GiB  # by the copier thread
    assert lost == []
    actors.stop().get(timeout=REPLY_TIMEOUT)
