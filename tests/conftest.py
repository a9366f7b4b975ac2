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
