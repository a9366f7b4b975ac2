"""A 1 GiB reply between procs of this host stalls neither heartbeats nor other
connections (issue 11 §2).

The reply's buffer is offloaded: the client's copier thread maps or copies it
out of the actor's memory while calls to another actor go on, and no peer is
declared lost. The same over TCP: ``tests/transport/test_large_frames.py``
(it attaches to a worker on loopback, so it runs after ``tests/multihost``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from danaus._runtime.node import this_node
from danaus.actor import ProcMesh, this_host
from large_blobs import Blob, check_blob, lost_peers

from .conftest import REPLY_TIMEOUT

GiB = 1 << 30


@pytest.fixture(scope="module")
def local() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(180)
def test_a_1gib_reply_between_procs_of_this_host_is_copied_off_the_io_loop(local) -> None:
    actors = local.spawn("large_local", Blob)
    sender, other = actors.slice(gpus=0), actors.slice(gpus=1)
    lost = lost_peers()
    rt = this_node().runtime
    copied = rt.offload.copied_off_loop
    big = sender.blob.call_one(GiB)
    answered = 0
    while not big.done():  # other calls go on while the reply is produced and copied
        assert other.echo.call_one(answered).get(timeout=REPLY_TIMEOUT) == answered
        answered += 1
    value = big.get(timeout=REPLY_TIMEOUT)
    check_blob(value, GiB)
    del value, big
    gc.collect()
    assert other.echo.call_one(-1).get(timeout=REPLY_TIMEOUT) == -1
    if rt.offload.enabled and rt.offload.ok_peers:
        assert rt.offload.copied_off_loop - copied >= GiB  # by the copier thread
    assert lost == []
    actors.stop().get(timeout=REPLY_TIMEOUT)
