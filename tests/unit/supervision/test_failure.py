"""What an owner is told (``MeshFailure``), the client's queue of unhandled failures
(``Faults``) and the registry of supervised meshes (``Supervised``), in this process."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest

import danaus.actor
from danaus._supervision.failure import MeshFailure
from danaus._supervision.hook import Faults
from danaus._supervision.supervised import Supervised


def test_a_report_starts_as_monarchs_then_gives_danaus_detail() -> None:
    f = MeshFailure(
        "trainers", [1, 3], "killed by SIGKILL (signal 9)",
        traceback="Traceback:\n  boom\n", log_tail=["last line", "really last"],
        actor="<root>.<m.Trainer trainers{'gpus': 1/4}>",
    )  # fmt: skip
    lines = f.report().splitlines()
    assert lines[0] == (
        "The actor <root>.<m.Trainer trainers{'gpus': 1/4}> and all its descendants have failed:"
    )
    assert lines[1] == "  killed by SIGKILL (signal 9)"
    assert lines[2] == "  MeshFailure on actor mesh 'trainers', crashed_ranks=[1, 3]"
    assert lines[3:6] == ["  Traceback of the failure (remote):", "    Traceback:", "      boom"]
    assert lines[6:] == [
        "  Last 2 lines of output of the process:", "    last line", "    really last",
    ]  # fmt: skip
    plain = MeshFailure("m", [0], "gone").report()
    assert plain == "MeshFailure on actor mesh 'm', crashed_ranks=[0]:\n  gone"
    assert (
        str(f)
        == repr(f)
        == (
            "MeshFailure(mesh_name='trainers', crashed_ranks=[1, 3], "
            "reason='killed by SIGKILL (signal 9)')"
        )
    )


def test_a_failure_travels_without_its_mesh() -> None:
    f = MeshFailure("m", (2,), "why", "tb", mesh=object(), log_tail=("x",), actor="a")  # type: ignore[arg-type]
    again = pickle.loads(pickle.dumps(f))
    assert again.mesh is None  # the owner's handle stays with the owner
    assert (again.mesh_name, again.crashed_ranks, again.reason, again.traceback) == (
        "m", [2], "why", "tb",
    )  # fmt: skip
    assert (again.log_tail, again.actor) == (["x"], "a")


def test_unhandled_failures_reach_the_hook_in_order_on_one_thread_until_the_node_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, str]] = []
    two = threading.Event()

    def hook(failure: MeshFailure) -> None:
        seen.append((failure.mesh_name, threading.current_thread().name))
        if len(seen) == 2:
            two.set()

    monkeypatch.setattr(danaus.actor, "unhandled_fault_hook", hook)
    faults = Faults()
    assert faults.thread is None  # no thread until the first failure
    faults.submit(MeshFailure("a", [0], "x"))
    faults.submit(MeshFailure("b", [0], "y"))
    assert two.wait(30)
    assert seen == [("a", "danaus-faults"), ("b", "danaus-faults")]
    thread = faults.thread
    faults.on_node_end()  # waits for the thread
    assert thread is not None and not thread.is_alive()
    faults.submit(MeshFailure("c", [0], "after the end"))  # dropped, not queued
    assert faults.thread is thread and [m for m, _ in seen] == ["a", "b"]


def test_a_supervised_mesh_is_handed_to_its_watcher_until_forgotten() -> None:
    reg = Supervised()
    got: list[Any] = []
    reg.watch("m.1", lambda rank, reason, tb, tail: got.append((rank, reason)) or True)
    assert reg.handlers["m.1"](2, "crash", "", ()) is True and got == [(2, "crash")]
    reg.forget("m.1")
    reg.forget("m.1")  # twice: fine
    assert "m.1" not in reg.handlers

    class Sup:
        ended = 0

        def _end_quietly(self) -> None:
            self.ended += 1

    sups = [Sup(), Sup()]
    reg.supervisors.extend(sups)
    reg.watch("m.2", lambda *a: True)
    reg.on_node_end()
    assert [s.ended for s in sups] == [1, 1] and reg.handlers == {} and reg.supervisors == []
