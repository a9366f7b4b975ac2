"""A Future waits through two narrow interfaces: its thread's Waits and the reply's Reader."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from danaus._actor.core import future as future_mod
from danaus._actor.core.future import Future, Pending


class Waits:
    def __init__(self) -> None:
        self.events: list[str] = []

    def begin_wait(self) -> None:
        self.events.append("begin")

    def end_wait(self) -> None:
        self.events.append("end")


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> Waits:
    w = Waits()
    monkeypatch.setattr(future_mod, "_waits", lambda runtime=None: w)
    return w


def test_a_blocking_get_is_bracketed_by_its_threads_waits(waits: Waits) -> None:
    pending = Pending()

    class Reader:
        def read_directly(
            self, done: Callable[[], bool], timeout: float, bell: int = -1
        ) -> bool | None:
            assert waits.events == ["begin"]  # told before the thread blocks
            pending.set_result(42)  # the reply this thread read itself
            return True

    pending.reader = Reader()
    assert Future._create(pending, "a call").get(timeout=5) == 42
    assert waits.events == ["begin", "end"]


def test_a_failed_wait_still_ends_it(waits: Waits) -> None:
    pending = Pending()

    class Reader:
        def read_directly(
            self, done: Callable[[], bool], timeout: float, bell: int = -1
        ) -> bool | None:
            pending.set_exception(KeyError("k"))
            return True

    pending.reader = Reader()
    with pytest.raises(KeyError):
        Future._create(pending, "a call").get()
    assert waits.events == ["begin", "end"]


def test_a_result_already_there_needs_no_wait(waits: Waits) -> None:
    fut: Future[Any] = Future._resolved(7)
    assert fut.get() == 7 and waits.events == []


def test_outside_any_actor_the_thread_waits_through_the_runtime() -> None:
    # No context of an actor on this thread: the waits are the runtime's (None without a node).
    from danaus._runtime.node import this_node

    node = this_node(start=False)
    assert future_mod._waits() is (None if node is None else node.runtime.backpressure)
