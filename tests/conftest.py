"""Fixtures shared by every suite."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

import danaus.config


@pytest.fixture
def settings() -> Iterator[Callable[..., None]]:
    """``settings(name=value, ...)`` configures danaus for one test; restored after it."""
    saved = danaus.config.get_runtime_config()
    yield danaus.config.configure
    danaus.config.clear_runtime_config()
    danaus.config.configure(**saved)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave ``slow`` tests out unless a ``-m`` expression is given (``-m slow`` runs them)."""
    if config.getoption("markexpr"):
        return
    slow = [i for i in items if i.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i.get_closest_marker("slow") is None]
