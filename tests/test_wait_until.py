"""``danaus.testing.wait_until``: polls a state nothing announces, with a deadline."""

from __future__ import annotations

import itertools

import pytest

from danaus.testing import wait_until


def test_it_returns_the_first_value_that_holds() -> None:
    counter = itertools.count()
    assert (
        wait_until(lambda: next(counter), 20, "the counter reaches 3", until=lambda n: n >= 3) == 3
    )
    assert wait_until(lambda: "ready", 20, "a truthy value") == "ready"


def test_on_timeout_it_names_what_and_the_last_value_seen() -> None:
    with pytest.raises(AssertionError, match=r"waiting for: the queue drains \(last value: 7\)"):
        wait_until(lambda: 7, 0, "the queue drains", until=lambda n: n == 0, interval=0)


def test_what_the_probe_raises_propagates() -> None:
    def probe() -> bool:
        raise KeyError("gone")

    with pytest.raises(KeyError, match="gone"):
        wait_until(probe, 20, "never")
