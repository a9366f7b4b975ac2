"""pytest plugin for Monarch's tests run against danaus (``-p conformance_plugin``).

Monarch's own ``conftest.py`` needs its Rust extension, so the runner removes it
and loads this instead. It registers Monarch's markers and runs ``async def``
tests and fixtures (Monarch's ``asyncio_mode = "auto"``): with pytest-asyncio
when it is installed, else with the stand-in in ``../shims/pytest_asyncio.py``
(on ``PYTHONPATH`` then, so spawned procs import it too), which runs each on one
event loop.
"""

from __future__ import annotations

import inspect
from typing import Any

import monarch  # noqa: F401  (installs the monarch -> danaus alias)
import pytest
import pytest_asyncio  # the real one, or ../shims/pytest_asyncio.py where it is missing

HAVE_PYTEST_ASYNCIO = not getattr(pytest_asyncio, "IS_DANAUS_SHIM", False)
_run: Any = getattr(pytest_asyncio, "run", None)
_sync: Any = getattr(pytest_asyncio, "sync", None)


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
