"""Offloaded arrays between procs of one host travel in shared snapshot slots.

The caller copies an array once into a slot (a shared mapping), the receiver
maps it copy-on-write and hands it to the actor; the slot goes back to the
caller only once nothing refers to the mapping there. So: an array the actor
keeps never changes under it, whatever is sent next; an actor may write to
what it received; slots are reused once returned; and the slots stay within
``snapshot_pool`` (beyond it, a private snapshot is copied as before). The offloader
alone, with a stand-in runtime: ``tests/unit/messaging/test_offload.py``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import danaus.config
from danaus._runtime.node import this_node
from danaus.actor import Actor, ActorMesh, endpoint, this_host
from danaus.testing import wait_until

from .conftest import REPLY_TIMEOUT

MiB = 1 << 20
N = 4 * MiB


class Keeper(Actor):
    def __init__(self) -> None:
        self.kept: list[Any] = []

    @endpoint
    def keep(self, a: Any) -> int:
        self.kept.append(a)
        return int(a[0])

    @endpoint
    def ranges(self) -> list[tuple[int, int]]:
        return [(int(a.min()), int(a.max())) for a in self.kept]

    @endpoint
    def scribble(self, a: Any) -> int:
        first = int(a.max())
        a[:] = 9  # the actor owns what it received (copy-on-write)
        return first * 1000 + int(a.min())

    @endpoint
    def drop(self) -> int:
        n = len(self.kept)
        self.kept.clear()
        gc.collect()
        return n


@pytest.fixture(scope="module")
def keeper() -> Iterator[ActorMesh[Keeper]]:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = pm.spawn("keeper", Keeper)
    mesh.keep.call_one(np.zeros(N, np.uint8)).get(timeout=REPLY_TIMEOUT)  # offload agreed
    mesh.drop.call_one().get(timeout=REPLY_TIMEOUT)
    yield mesh
    pm.stop().get(timeout=REPLY_TIMEOUT)


def _peer(mesh: ActorMesh[Keeper]) -> str:
    [proc] = danaus.stats(mesh).get(timeout=REPLY_TIMEOUT).procs
    return proc.proc


def _wait_returned(peer: str) -> None:
    off = this_node().runtime.offload
    wait_until(
        lambda: off.slots_lent(peer),
        REPLY_TIMEOUT,
        "the lent slots come back",
        until=lambda lent: not lent,
        interval=0.005,
    )


def _require_shared(mesh: ActorMesh[Keeper]) -> None:
    """Fail, saying why, where shared slots cannot be used (never a silent skip)."""
    off = this_node().runtime.offload
    assert off.shared, "no memfd_create or MAP_SHARED here: shared slots are off"
    assert _peer(mesh) in off.ok_peers, (
        "the actor's proc cannot read this process's memory (process_vm_readv refused: "
        "see /proc/sys/kernel/yama/ptrace_scope), so nothing is offloaded to it"
    )


def test_kept_arrays_never_change_and_slots_come_back(keeper) -> None:
    _require_shared(keeper)
    off = this_node().runtime.offload
    peer = _peer(keeper)
    a = np.zeros(N, np.uint8)
    for v in range(1, 7):
        a[:] = v
        assert keeper.keep.call_one(a).get(timeout=REPLY_TIMEOUT) == v
    a[:] = 0
    assert keeper.ranges.call_one().get(timeout=REPLY_TIMEOUT) == [(v, v) for v in range(1, 7)]
    assert off.slots_lent(peer) == 6  # all still mapped by the actor
    assert keeper.drop.call_one().get(timeout=REPLY_TIMEOUT) == 6
    _wait_returned(peer)
    made = off.slots_made
    for v in range(11, 17):  # the returned slots serve again
        a[:] = v
        assert keeper.keep.call_one(a).get(timeout=REPLY_TIMEOUT) == v
    assert off.slots_made == made
    assert keeper.ranges.call_one().get(timeout=REPLY_TIMEOUT) == [(v, v) for v in range(11, 17)]
    keeper.drop.call_one().get(timeout=REPLY_TIMEOUT)
    _wait_returned(peer)


def test_the_receiver_may_write_to_what_it_got(keeper) -> None:
    a = np.full(N, 5, np.uint8)
    for _ in range(3):  # the same slot again and again: the actor's writes stay its own
        assert keeper.scribble.call_one(a).get(timeout=REPLY_TIMEOUT) == 5009  # saw 5s, wrote 9s
    assert int(a.min()) == int(a.max()) == 5
    _wait_returned(_peer(keeper))


def test_slots_stay_within_snapshot_pool(keeper) -> None:
    _require_shared(keeper)
    off = this_node().runtime.offload
    peer = _peer(keeper)
    a = np.zeros(N, np.uint8)
    with danaus.config.configured(snapshot_pool=2 * N):
        for v in range(1, 6):  # kept: only two fit in slots, the rest copied privately
            a[:] = v
            assert keeper.keep.call_one(a).get(timeout=REPLY_TIMEOUT) == v
            assert off.slot_bytes <= 2 * N
        assert off.slots_lent(peer) <= 2
        want = [(v, v) for v in range(1, 6)]
        assert keeper.ranges.call_one().get(timeout=REPLY_TIMEOUT) == want
        keeper.drop.call_one().get(timeout=REPLY_TIMEOUT)
        _wait_returned(peer)
