"""A ``Deferred`` (a reply's value, decoded by whoever reads it first) is computed once,
whichever threads read it. That replies are decoded by their reader, not the I/O thread:
``tests/integration/test_lazy_replies.py``."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from danaus._actor.core.future import Deferred


class _Counting(Deferred):
    __slots__ = ("calls", "gate")

    def __init__(self) -> None:
        self._input = "what computing needs"  # a subclass sets its input itself
        self.calls = 0
        self.gate = threading.Event()

    def _compute(self, todo: Any) -> Any:
        assert todo == "what computing needs"
        self.calls += 1
        self.gate.wait(10)
        return self.calls


def test_a_deferred_is_computed_once_however_many_threads_read_it() -> None:
    d = _Counting()
    got: list[Any] = []
    readers = [threading.Thread(target=lambda: got.append(d.resolve())) for _ in range(4)]
    for t in readers:
        t.start()
    d.gate.set()
    for t in readers:
        t.join(10)
    assert got == [1, 1, 1, 1] and d.calls == 1 and d.resolve() == 1


def test_a_deferred_interrupted_while_computed_is_computed_by_the_next_reader() -> None:
    calls: list[int] = []

    def fn() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return 7

    d = Deferred(fn)
    with pytest.raises(KeyboardInterrupt):
        d.resolve()
    assert d.resolve() == 7 and d.resolve() == 7 and len(calls) == 2


def test_a_deferred_keeps_its_exception() -> None:
    d = Deferred(lambda: 1 / 0)
    for _ in range(2):
        with pytest.raises(ZeroDivisionError):
            d.resolve()
