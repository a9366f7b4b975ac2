"""The NIXL backend across hosts: buffers owned by procs of a ``danaus worker`` host.

As in ``test_cross_host.py``, the other host is a worker process on loopback with
a host token of its own: the check and pin of a buffer travel to its procs over
authenticated TCP (with the deadline as seconds left, since another host's clock
is not ours) and the bytes over NIXL/UCX.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

import danaus.actor
from danaus.actor import ActorMesh, HostMesh, ProcMesh
from danaus.rdma import RDMAAction, RDMAError, RDMAOwnerLostError
from danaus.testing import FaultRecorder
from loopback_worker import loopback_worker

from .conftest import REPLY_TIMEOUT, random_bytes
from .test_nixl import NixlHolder

MiB = 1 << 20


def _name() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def faults() -> Iterator[FaultRecorder]:
    recorder = FaultRecorder()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(danaus.actor, "unhandled_fault_hook", recorder)
        yield recorder


@pytest.fixture(scope="module")
def remote(faults: FaultRecorder) -> Iterator[HostMesh]:
    with loopback_worker() as hm:
        yield hm


@pytest.fixture(scope="module")
def rprocs(remote: HostMesh) -> ProcMesh:
    pm = remote.spawn_procs(per_host={"r": 2})
    assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
    return pm


@pytest.fixture(scope="module")
def rholders(rprocs: ProcMesh) -> ActorMesh[NixlHolder]:
    mesh = rprocs.spawn("rnholders", NixlHolder)
    mesh.initialized.get(timeout=REPLY_TIMEOUT)
    return mesh


@pytest.mark.parametrize("n", [1024, 24 * MiB + 3])
def test_the_client_reads_and_writes_a_nixl_buffer_on_another_host(
    rholders: ActorMesh[NixlHolder], n: int
) -> None:
    name = _name()
    buf = rholders.slice(r=0).make.call_one(name, n, "numpy", 1).get(timeout=REPLY_TIMEOUT)
    assert buf.backend == "nixl"
    dst = np.zeros(n, np.uint8)
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert np.array_equal(dst, random_bytes(n, 1))
    src = random_bytes(n, 2)
    buf.write_from(src).get(timeout=REPLY_TIMEOUT)
    want = hashlib.sha256(src).hexdigest()
    assert rholders.slice(r=0).digest.call_one(name).get(timeout=REPLY_TIMEOUT) == want


def test_a_batch_across_hosts_and_a_drop_mean_what_they_do_on_one_host(
    rholders: ActorMesh[NixlHolder],
) -> None:
    a = rholders.slice(r=0).make.call_one(_name(), MiB, "numpy", 3).get(timeout=REPLY_TIMEOUT)
    b = rholders.slice(r=1).make.call_one(_name(), MiB, "numpy", 4).get(timeout=REPLY_TIMEOUT)
    da, db = np.zeros(MiB, np.uint8), np.zeros(MiB, np.uint8)
    RDMAAction().read_remote(da, a).read_remote(db, b).submit().get(timeout=REPLY_TIMEOUT)
    assert np.array_equal(da, random_bytes(MiB, 3))
    assert np.array_equal(db, random_bytes(MiB, 4))
    rholders.slice(r=0).drop.call_one(a).get(timeout=REPLY_TIMEOUT)
    with pytest.raises(RDMAError) as info:
        a.read_into(da).get(timeout=REPLY_TIMEOUT)
    assert "dropped" in str(info.value)


def test_a_nixl_owner_on_another_host_that_dies_fails_the_transfer(
    remote: HostMesh, faults: FaultRecorder
) -> None:
    pm = remote.spawn_procs(per_host={"v": 1})
    name = f"victim-{_name()}"
    holder = pm.spawn(name, NixlHolder)
    buf = holder.fill.call_one("x", MiB, 5).get(timeout=REPLY_TIMEOUT)
    pid = holder.pid.call_one().get(timeout=REPLY_TIMEOUT)
    dst = bytearray(MiB)
    buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    assert dst == b"\x05" * MiB
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RDMAOwnerLostError):
        buf.read_into(dst).get(timeout=REPLY_TIMEOUT)
    faults.wait_until(
        lambda events: any(e.mesh_name == name for e in events), "the victim's failure", 30
    )
    with contextlib.suppress(Exception):
        pm.stop().get(timeout=REPLY_TIMEOUT)
