"""Actor semantics in the client process: an actor of this proc runs beside the client's
thread, and an endpoint of a mesh is called through an adverb only. Across procs:
``tests/integration/test_semantics.py`` and ``tests/integration/test_adverbs.py``."""

from __future__ import annotations

import threading
import uuid

import pytest

from danaus.actor import Actor, endpoint, this_proc

# Bounded wait for a reply or an event: far above what a healthy call needs.
TIMEOUT = 30.0

_EVENTS: dict[str, threading.Event] = {}
_EVENTS_LOCK = threading.Lock()


def _event(key: str) -> threading.Event:
    with _EVENTS_LOCK:
        return _EVENTS.setdefault(key, threading.Event())


class Waiter(Actor):
    """``wait(key)`` blocks this actor until ``_event(key)`` is set."""

    @endpoint
    def wait(self, key: str, timeout: float = TIMEOUT) -> bool:
        return _event(key).wait(timeout)


def test_actors_on_this_proc_run_concurrently_with_the_client_thread() -> None:
    waiter = this_proc().spawn("client_side_waiter", Waiter)
    key = uuid.uuid4().hex
    waiting = waiter.wait.call_one(key)
    with pytest.raises(TimeoutError):
        waiting.get(timeout=0.05)
    _event(key).set()  # the actor lives in this very process
    assert waiting.get(timeout=TIMEOUT) is True
    waiter.stop().get(timeout=TIMEOUT)


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.value = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.value += by
        return self.value


def test_endpoint_of_a_mesh_cannot_be_called_without_an_adverb() -> None:
    counters = this_proc().spawn("counters", Counter, 10)
    with pytest.raises(TypeError):
        counters.incr(1)
    counters.stop().get(timeout=TIMEOUT)
