"""``set_meta``: Monarch's simulator label, a stack with no effect in danaus."""

from __future__ import annotations

import threading
import warnings

import pytest

import danaus
from danaus._tensor import simulator
from danaus.config import NoEffectWarning


@pytest.fixture
def fresh_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simulator, "_warned", [False])
    monkeypatch.setattr(simulator, "_task_queue", [False])  # as if no task queue were loaded


def test_set_meta_does_not_warn_once_the_task_queue_reads_its_labels(
    fresh_warning: None,
) -> None:
    simulator.read_by_tasks()  # what importing danaus.simulator.task does
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with danaus.set_meta("labelled"):
            assert simulator.meta_stack() == ("labelled",)


def test_set_meta_nests_on_a_stack_and_warns_once_that_it_has_no_effect(
    fresh_warning: None,
) -> None:
    assert simulator.meta_stack() == ()
    with pytest.warns(NoEffectWarning, match="no effect") as seen, danaus.set_meta("outer"):
        assert simulator.meta_stack() == ("outer",)
        with danaus.set_meta({"phase": "fwd"}):
            assert simulator.meta_stack() == ("outer", {"phase": "fwd"})
        assert simulator.meta_stack() == ("outer",)
    assert len(seen) == 1 and seen[0].filename == __file__
    assert simulator.meta_stack() == ()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second use in the process does not warn again
        with danaus.set_meta("again"):
            assert simulator.meta_stack() == ("again",)


def test_the_stack_unwinds_on_an_exception_and_is_per_thread(fresh_warning: None) -> None:
    seen: list[tuple[object, ...]] = []
    with pytest.warns(NoEffectWarning), pytest.raises(KeyError), danaus.set_meta("failing"):
        other = threading.Thread(target=lambda: seen.append(simulator.meta_stack()))
        other.start()
        other.join()
        raise KeyError("x")
    assert seen == [()]
    assert simulator.meta_stack() == ()
