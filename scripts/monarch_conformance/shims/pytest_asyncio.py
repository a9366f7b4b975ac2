"""A stand-in for ``pytest_asyncio`` where it is not installed (Monarch's tests import it).

``scripts/monarch-conformance`` puts this directory on ``PYTHONPATH`` only when the
real pytest-asyncio is missing, so the procs a test spawns (which import the test
module, and with it ``pytest_asyncio``) find it too. ``fixture`` runs an ``async``
fixture to completion on one event loop; ``conformance_plugin`` runs ``async def``
tests on the same loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any

import pytest

IS_DANAUS_SHIM = True

_loop: asyncio.AbstractEventLoop | None = None


def run(coro: Any) -> Any:
    """Run ``coro`` to completion on the stand-in's event loop."""
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(coro)


def sync(fn: Any) -> Any:
    """An async fixture function as a plain one, run on the stand-in's loop."""
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        def gen(*a: Any, **k: Any) -> Any:
            agen = fn(*a, **k)
            value = run(agen.__anext__())
            yield value
            try:
                run(agen.__anext__())
            except StopAsyncIteration:
                pass

        return gen
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        def plain(*a: Any, **k: Any) -> Any:
            return run(fn(*a, **k))

        return plain
    return fn


def fixture(*args: Any, **kwargs: Any) -> Any:
    """``pytest_asyncio.fixture``: an async fixture run to completion."""

    def wrap(fn: Any) -> Any:
        return pytest.fixture(**kwargs)(sync(fn))

    if args and callable(args[0]):
        return wrap(args[0])
    return wrap
