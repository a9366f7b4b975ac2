"""RDMA leases: a ``drop()`` during a same-host transfer never frees memory under it.

A transfer pins the owner's registration from its check to its end. A drop
meanwhile makes later transfers fail at once, but its future completes only
once the transfers under way have ended; the owner frees (and reuses) the
memory after that, so no byte of a late write lands in memory that now
belongs to something else.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from danaus.actor import Actor, endpoint, this_host
from danaus.rdma import RDMABuffer, RDMAError, is_rdma_available

from .conftest import TIMEOUT

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not is_rdma_available(), reason="needs process_vm_writev"),
]

N = 256 << 20  # large enough that the write is still going when the drop arrives


class Owner(Actor):
    def __init__(self) -> None:
        self.data: Any = None
        self.buf: RDMABuffer | None = None
        self.reused: Any = None

    @endpoint
    def register(self) -> RDMABuffer:
        self.data = np.zeros(N, dtype=np.uint8)
        self.buf = RDMABuffer(self.data)
        return self.buf

    @endpoint
    def drop_and_reuse(self, remote_dropped: bool = False) -> bool:
        """Drop (unless the caller did), wait for it, free the memory and reuse it at once.

        Returns whether the drop had to wait for a transfer.
        """
        assert self.buf is not None
        waited = False
        if not remote_dropped:
            fut = self.buf.drop()
            waited = not fut.done()
            fut.get(timeout=TIMEOUT)
        self.buf = None
        self.data = None
        gc.collect()
        # The allocator hands the same pages back for the same size: a write still
        # going on would land here.
        self.reused = np.full(N, 0x11, dtype=np.uint8)
        return waited

    @endpoint
    def reused_is_intact(self) -> bool:
        return bool((self.reused == 0x11).all())


@pytest.fixture
def owner():
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    yield pm.spawn("owner", Owner)
    pm.stop().get(timeout=TIMEOUT)


def _started(fut: Any) -> Any:
    """``fut``, started: a transfer starts when first waited for (Monarch's rule), and a
    wait of 0 seconds starts it without blocking."""
    try:
        fut.get(timeout=0)
    except Exception:  # still running (TimeoutError): the future keeps its outcome
        pass
    return fut


def _outcome(write: Any) -> str:
    try:
        write.get(timeout=60)
    except RDMAError as e:  # a clear error is allowed; corruption is not
        assert "drop" in str(e) or "dropped" in str(e), e
        return "failed"
    return "done"


def test_the_owner_dropping_during_a_write_waits_for_it(owner) -> None:
    buf = owner.register.call_one().get(timeout=TIMEOUT)
    src = np.full(N, 0x5A, dtype=np.uint8)
    write = _started(buf.write_from(src))
    # Sent after the write's check on the same connection: the owner sees the check
    # (and pins the buffer) before it drops.
    waited = owner.drop_and_reuse.call_one().get(timeout=60)
    assert write.done(), "the drop completed while the write was still running"
    assert _outcome(write) == "done"
    assert waited  # the drop did wait: the write was under way when it came
    assert owner.reused_is_intact.call_one().get(timeout=TIMEOUT)


def test_a_remote_drop_during_a_write_is_answered_after_the_write(owner) -> None:
    buf = owner.register.call_one().get(timeout=TIMEOUT)
    src = np.full(N, 0x5A, dtype=np.uint8)
    write = _started(buf.write_from(src))
    buf.drop().get(timeout=60)  # after the write's check, on the same connection
    assert write.done(), "the drop was answered while the write was still running"
    assert _outcome(write) == "done"
    owner.drop_and_reuse.call_one(True).get(timeout=60)
    assert owner.reused_is_intact.call_one().get(timeout=TIMEOUT)
    # Later transfers fail at once, with a clear error.
    with pytest.raises(RDMAError, match="dropped"):
        buf.write_from(src).get(timeout=TIMEOUT)
