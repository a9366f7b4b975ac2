"""Unit tests: one layer at a time, inside this process (issue 39 part 7).

``tests/unit/<layer>/`` holds the tests of one layer of ``src/danaus`` (the layer list
is ``tests/test_layers.py``'s ``LAYERS``) that need no other process: in-process
objects, fakes of the layer below, socketpairs within this process. Behaviour across
processes belongs in ``tests/integration/`` (or the suite of its subsystem).

Every test here runs under :func:`_in_this_process_only`, which fails it when it (or
a thread it started) starts a process (``subprocess``, ``multiprocessing``,
``os.fork``/``posix_spawn``/``exec*``/``system``) or sleeps (``time.sleep`` or
``asyncio.sleep`` of more than 0 s): a unit test waits for events, never for time.
Threads that were running before the test (a node left by another suite in the same
run) are not the test's and are let through. Fixtures of a wider scope (module,
class, session) that a unit test uses are held to the same rule while they are set
up (:func:`pytest_fixture_setup`).
"""

from __future__ import annotations

import asyncio
import multiprocessing.process
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest


class NotAUnitTest(AssertionError):
    """A unit test started a process or slept: move it to tests/integration or wait on
    an event instead."""


# What starts a process: (owner, attribute). ``os.spawn*`` and ``pty.fork`` go through
# ``os.fork``; ``os.popen`` and asyncio's subprocesses through ``Popen._execute_child``.
PROCESS_STARTERS: list[tuple[Any, str]] = [
    (subprocess.Popen, "_execute_child"),
    (multiprocessing.process.BaseProcess, "start"),
    *(
        (os, name)
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve")
        if hasattr(os, name)
    ),
]


class Guard:
    """What the running unit test tried that a unit test must not do."""

    def __init__(self) -> None:
        self.others = set(threading.enumerate()) - {threading.current_thread()}
        self.seen: list[str] = []

    def ours(self) -> bool:
        """Whether the calling thread is the test's (not one that ran before it)."""
        return threading.current_thread() not in self.others

    def refuse(self, what: str) -> NotAUnitTest:
        message = (
            f"{what} in a unit test (tests/unit): a unit test runs in this process and "
            "waits on events, not on time; test across processes in tests/integration"
        )
        self.seen.append(message)
        return NotAUnitTest(message)


def _refusing(guard: Guard, what: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        if not guard.ours():
            return original(*args, **kwargs)
        raise guard.refuse(what)

    return refused


def install(guard: Guard, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every process start and every sleep of the test's threads fail."""
    for owner, name in PROCESS_STARTERS:
        label = f"{getattr(owner, '__name__', owner)}.{name}()"
        monkeypatch.setattr(owner, name, _refusing(guard, label, getattr(owner, name)))

    real_sleep = time.sleep
    real_async_sleep = asyncio.sleep

    def sleep(seconds: float) -> None:
        if seconds > 0 and guard.ours():
            raise guard.refuse(f"time.sleep({seconds!r})")
        real_sleep(seconds)

    def async_sleep(delay: float, result: Any = None) -> Any:
        if delay > 0 and guard.ours():
            raise guard.refuse(f"asyncio.sleep({delay!r})")
        return real_async_sleep(delay, result)

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(asyncio, "sleep", async_sleep)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: Any) -> Any:
    """A module-, class- or session-scoped fixture a unit test uses may not start a
    process or sleep either (function-scoped ones run under the autouse fixture)."""
    if fixturedef.scope == "function":
        return (yield)
    guard = Guard()
    patch = pytest.MonkeyPatch()
    install(guard, patch)
    try:
        result = yield
    finally:
        patch.undo()
    if guard.seen:
        pytest.fail(f"fixture {fixturedef.argname!r}: " + "\n".join(guard.seen), pytrace=False)
    return result


@pytest.fixture(autouse=True)
def _in_this_process_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[Guard]:
    """Fails the test if it started a process or slept, even where the code under test
    caught the :class:`NotAUnitTest` it got."""
    guard = Guard()
    install(guard, monkeypatch)
    yield guard
    monkeypatch.undo()
    if guard.seen:
        pytest.fail("\n".join(guard.seen), pytrace=False)
