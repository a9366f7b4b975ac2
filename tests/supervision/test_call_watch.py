"""The lock-free watch of one call's proc (``watch_call``, used by ``call_one``).

A port watched before its proc is lost is told of the loss; one watched after
it sees the loss at once; one unwatched is not told. A loss that lands while a
call is being watched is never missed (it would wait forever).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from danaus._runtime.messaging.runtime import Runtime
from danaus._wire.ids import ProcId

PROC = ProcId("gone", "unix:/nonexistent/gone.sock")


class Told:
    def __init__(self, heard: list[Any], port: list[int]) -> None:
        self.heard, self.port = heard, port

    def peer_lost(self, name: str, reason: str) -> None:
        self.heard.append((self.port[0], name, reason))


@pytest.fixture
def rt(tmp_path: Any) -> Iterator[Runtime]:
    rt = Runtime("watcher", str(tmp_path))
    yield rt
    rt.loop.close()


def _port(rt: Runtime, heard: list[Any]) -> int:
    box: list[int] = []
    box.append(rt.router.open_port(Told(heard, box)).port)
    return box[0]


def test_watched_before_the_loss_is_told_after_it_sees_it_unwatched_is_not(rt: Runtime) -> None:
    heard: list[Any] = []
    kept, dropped = _port(rt, heard), _port(rt, heard)
    assert rt.peers.watch_call(PROC, kept) is None
    assert rt.peers.watch_call(PROC, dropped) is None
    rt.peers.unwatch_call(PROC, dropped)
    rt.peers.peer_lost(PROC.name, "it died")
    assert heard == [(kept, "gone", "it died")]
    late = _port(rt, heard)
    assert rt.peers.watch_call(PROC, late) == "it died"
    assert len(heard) == 1


class _LosingSet(set[int]):
    """A peer's ``calls`` set whose ``add`` has the proc lost just before or after it."""

    def __init__(self, rt: Runtime, before: bool) -> None:
        super().__init__()
        self.rt, self.before = rt, before

    def add(self, port: int) -> None:
        if self.before:
            self.rt.peers.peer_lost(PROC.name, "it died")
        super().add(port)
        if not self.before:
            self.rt.peers.peer_lost(PROC.name, "it died")


@pytest.mark.parametrize("before", [True, False], ids=["lost-before-added", "lost-after-added"])
def test_a_loss_while_a_call_is_being_watched_is_never_missed(rt: Runtime, before: bool) -> None:
    """The loss lands inside ``watch_call``: the call must hear of it or see it."""
    heard: list[Any] = []
    rt.peers.watch_call(PROC, _port(rt, heard))  # the peer exists
    heard.clear()
    rt.peers.table[PROC.name].calls = _LosingSet(rt, before)
    port = _port(rt, heard)
    saw = rt.peers.watch_call(PROC, port)
    told = [p for p, _, _ in heard]
    assert saw == "it died" or port in told, "the call was neither told of the loss nor saw it"
