"""pytest plugin for Monarch's tests run against danaus (``-p conformance_plugin``).

Monarch's own ``conftest.py`` needs its Rust extension, so the runner removes it
and loads this instead. It registers Monarch's markers and runs ``async def``
tests and fixtures (Monarch's ``asyncio_mode = "auto"``): with pytest-asyncio
when it is installed, else with a small stand-in that runs each on one event
loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
import types
from typing import Any

import monarch  # noqa: F401  (installs the monarch -> danaus alias)
import pytest

try:
    import pytest_asyncio  # noqa: F401

    HAVE_PYTEST_ASYNCIO = True
except ImportError:
    HAVE_PYTEST_ASYNCIO = False

_loop: asyncio.AbstractEventLoop | None = None


def _run(coro: Any) -> Any:
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(coro)


def _sync(fn: Any) -> Any:
    """An async fixture function as a plain one, run on the plugin's loop."""
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        def gen(*a: Any, **k: Any) -> Any:
            agen = fn(*a, **k)
            value = _run(agen.__anext__())
            yield value
            try:
                _run(agen.__anext__())
            except StopAsyncIteration:
                pass

        return gen
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        def plain(*a: Any, **k: Any) -> Any:
            return _run(fn(*a, **k))

        return plain
    return fn


def _fixture(*args: Any, **kwargs: Any) -> Any:
    """``pytest_asyncio.fixture`` without pytest-asyncio: an async fixture run to completion."""

    def wrap(fn: Any) -> Any:
        return pytest.fixture(**kwargs)(_sync(fn))

    if args and callable(args[0]):
        return wrap(args[0])
    return wrap


if not HAVE_PYTEST_ASYNCIO:
    shim = types.ModuleType("pytest_asyncio")
    shim.fixture = _fixture  # type: ignore[attr-defined]
    sys.modules["pytest_asyncio"] = shim


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "oss_skip: marks tests to skip in OSS CI")
    config.addinivalue_line("markers", "asyncio: an async test")


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef: Any, request: Any) -> None:
    """``async def`` fixtures under plain ``@pytest.fixture`` (asyncio_mode = "auto")."""
    if not HAVE_PYTEST_ASYNCIO:
        fixturedef.func = _sync(fixturedef.func)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if HAVE_PYTEST_ASYNCIO or not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    _run(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
    return True
