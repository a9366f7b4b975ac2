"""What fails an actor, and what its caller and its owner see (issue 5).

An exception in a call with a reply is the caller's business (``ActorError``;
the actor lives on). Everything else — an exception nobody can be told of, a
``BaseException``, a failing ``__init__``, ``abort()``, the process exiting or
being killed — fails the actor: its callers get ``SupervisionError`` and its
owner (here the client, whose hook is a recorder) gets one ``MeshFailure``.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

import pytest

from danaus.actor import (
    Actor,
    ActorError,
    MeshFailure,
    ProcMesh,
    SupervisionError,
    context,
    endpoint,
)

from .conftest import TIMEOUT, FaultRecorder


class Fatal(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt."""


class Victim(Actor):
    def __init__(self) -> None:
        self.calls = 0

    @endpoint
    def ping(self, x: int) -> int:
        self.calls += 1
        return x

    @endpoint
    def count(self) -> int:
        return self.calls

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def raise_value_error(self) -> None:
        raise ValueError("bad value 42")

    @endpoint
    def raise_base_exception(self) -> None:
        raise Fatal("beyond Exception")

    @endpoint
    def exit_process(self, code: int) -> None:
        os._exit(code)

    @endpoint
    def kill_own_process(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    @endpoint
    def segfault(self) -> None:
        ctypes.string_at(0)

    @endpoint
    def abort(self, reason: str | None = None) -> None:
        if reason is None:
            context().actor_instance.abort()
        context().actor_instance.abort(reason)


class FailingInit(Actor):
    def __init__(self, fail: bool) -> None:
        if fail:
            raise ValueError("cannot construct: no config")

    @endpoint
    def ping(self) -> str:
        return "pong"


def spawn_victims(spawn_procs: Callable[..., ProcMesh], name: str = "victims") -> Victim:
    pm = spawn_procs(gpus=2)
    mesh = pm.spawn(name, Victim)
    mesh.initialized.get(timeout=TIMEOUT)
    return mesh


def assert_one_failure(faults: FaultRecorder, name: str, rank: int) -> MeshFailure:
    (failure,) = faults.wait(1)
    assert isinstance(failure, MeshFailure)
    assert failure.mesh_name == name
    assert failure.crashed_ranks == [rank]
    return failure


def test_exception_in_a_call_is_an_actor_error_and_the_actor_lives_on(spawn_procs, faults) -> None:
    victims = spawn_victims(spawn_procs)
    one = victims.slice(gpus=1)
    with pytest.raises(ActorError) as info:
        one.raise_value_error.call_one().get(timeout=TIMEOUT)
    assert isinstance(info.value.exception, ValueError)
    assert one.ping.call_one(5).get(timeout=TIMEOUT) == 5
    assert faults.events == []


def test_exception_in_a_broadcast_fails_the_actor_and_reaches_its_owner(
    spawn_procs, faults
) -> None:
    victims = spawn_victims(spawn_procs)
    victims.slice(gpus=1).raise_value_error.broadcast()
    failure = assert_one_failure(faults, "victims", 1)
    assert "ValueError" in failure.reason and "bad value 42" in failure.reason
    assert "bad value 42" in failure.traceback
    with pytest.raises(SupervisionError):
        victims.slice(gpus=1).ping.call_one(1).get(timeout=TIMEOUT)


def test_base_exception_fails_the_actor_even_in_a_call_with_a_reply(spawn_procs, faults) -> None:
    victims = spawn_victims(spawn_procs)
    with pytest.raises(SupervisionError) as info:
        victims.slice(gpus=0).raise_base_exception.call_one().get(timeout=TIMEOUT)
    assert "Fatal" in str(info.value)
    failure = assert_one_failure(faults, "victims", 0)
    assert "Fatal" in failure.reason and "beyond Exception" in failure.reason
    with pytest.raises(SupervisionError):
        victims.slice(gpus=0).ping.call_one(1).get(timeout=TIMEOUT)


def test_failing_init_does_not_raise_at_spawn_but_initialized_raises_and_owner_hears(
    spawn_procs, faults
) -> None:
    pm = spawn_procs(gpus=2)
    mesh = pm.spawn("fragile", FailingInit, True)  # must not raise here
    with pytest.raises(ActorError) as info:
        mesh.initialized.get(timeout=TIMEOUT)
    assert isinstance(info.value.exception, ValueError)
    assert "no config" in str(info.value.exception)
    events = faults.wait(2)
    assert sorted(r for e in events for r in e.crashed_ranks) == [0, 1]
    assert all(e.mesh_name == "fragile" for e in events)
    assert all("__init__" in e.reason and "no config" in e.reason for e in events)
    with pytest.raises(SupervisionError):
        mesh.ping.call().get(timeout=TIMEOUT)


def test_a_mesh_whose_init_succeeds_on_the_same_procs_still_works(spawn_procs, faults) -> None:
    pm = spawn_procs(gpus=1)
    bad = pm.spawn("bad", FailingInit, True)
    faults.wait(1)
    good = pm.spawn("good", FailingInit, False)
    good.initialized.get(timeout=TIMEOUT)
    assert good.ping.call_one().get(timeout=TIMEOUT) == "pong"
    with pytest.raises(ActorError):
        bad.initialized.get(timeout=TIMEOUT)


@pytest.mark.parametrize(
    ("endpoint_name", "args", "how"),
    [
        ("exit_process", (3,), "exited with code 3"),
        ("kill_own_process", (), "SIGKILL"),
        ("segfault", (), "SIGSEGV"),
    ],
    ids=["os_exit", "sigkill", "sigsegv"],
)
def test_process_death_in_an_endpoint_fails_the_call_and_reaches_the_owner(
    spawn_procs, faults, endpoint_name: str, args: tuple[int, ...], how: str
) -> None:
    victims = spawn_victims(spawn_procs)
    doomed = victims.slice(gpus=1)
    with pytest.raises(SupervisionError) as info:
        getattr(doomed, endpoint_name).call_one(*args).get(timeout=TIMEOUT)
    assert how in str(info.value)
    failure = assert_one_failure(faults, "victims", 1)
    assert how in failure.reason
    assert victims.slice(gpus=0).ping.call_one(7).get(timeout=TIMEOUT) == 7


def test_process_killed_from_outside_reaches_the_owner(spawn_procs, faults) -> None:
    victims = spawn_victims(spawn_procs)
    pid = victims.slice(gpus=0).pid.call_one().get(timeout=TIMEOUT)
    os.kill(pid, signal.SIGKILL)
    failure = assert_one_failure(faults, "victims", 0)
    assert "SIGKILL" in failure.reason
    with pytest.raises(SupervisionError):
        victims.slice(gpus=0).ping.call_one(1).get(timeout=TIMEOUT)
    assert victims.slice(gpus=1).ping.call_one(2).get(timeout=TIMEOUT) == 2


def test_a_killed_process_is_reported_in_monarchs_words(spawn_procs, faults) -> None:
    """Monarch's report (its test_supervision_hierarchy matches on it): the actor's
    name ``<root>.<module.Class mesh{'dim': i/n}>``, then ``Killed(sig=9)``."""
    victims = spawn_victims(spawn_procs)
    pid = victims.slice(gpus=1).pid.call_one().get(timeout=TIMEOUT)
    os.kill(pid, signal.SIGKILL)
    failure = assert_one_failure(faults, "victims", 1)
    report = failure.report()
    assert failure.actor == f"<root>.<{__name__}.Victim victims{{'gpus': 1/2}}>"
    assert report.startswith(f"The actor {failure.actor} and all its descendants have failed:\n")
    assert "the process this actor was running on failed: Killed(sig=9)" in report
    assert "crashed_ranks=[1]" in report and "SIGKILL" in report  # danaus's detail follows
    # A later call to the dead actor says the same.
    with pytest.raises(SupervisionError, match="and all its descendants have failed"):
        victims.slice(gpus=1).ping.call_one(1).get(timeout=TIMEOUT)


def test_a_call_to_a_failed_actor_names_it_in_monarchs_words(spawn_procs, faults) -> None:
    victims = spawn_victims(spawn_procs)
    victims.slice(gpus=0).raise_base_exception.broadcast()
    failure = assert_one_failure(faults, "victims", 0)
    assert failure.report().startswith(
        f"The actor <root>.<{__name__}.Victim victims{{'gpus': 0/2}}> and all its "
        "descendants have failed:\n  "
    )
    with pytest.raises(SupervisionError) as info:
        victims.slice(gpus=0).ping.call_one(1).get(timeout=TIMEOUT)
    assert f"The actor <root>.<{__name__}.Victim victims{{'gpus': 0/2}}> and all its" in str(
        info.value
    )


def test_abort_with_a_reason_fails_the_actor_with_that_reason(spawn_procs, faults) -> None:
    victims = spawn_victims(spawn_procs)
    with pytest.raises(SupervisionError) as info:
        victims.slice(gpus=1).abort.call_one("disk is full").get(timeout=TIMEOUT)
    assert "disk is full" in str(info.value)
    failure = assert_one_failure(faults, "victims", 1)
    assert "disk is full" in failure.reason


def test_abort_without_a_reason_says_no_reason_provided(spawn_procs, faults) -> None:
    victims = spawn_victims(spawn_procs)
    victims.slice(gpus=0).abort.broadcast()
    failure = assert_one_failure(faults, "victims", 0)
    assert "no reason provided" in failure.reason
    assert victims.slice(gpus=1).ping.call_one(3).get(timeout=TIMEOUT) == 3


def test_mesh_failure_text_names_the_mesh_the_ranks_and_the_reason(spawn_procs, faults) -> None:
    victims = spawn_victims(spawn_procs, name="trainers")
    victims.slice(gpus=1).raise_value_error.broadcast()
    failure = assert_one_failure(faults, "trainers", 1)
    for text in (str(failure), failure.report()):
        assert "MeshFailure" in text
        assert "trainers" in text
        assert "crashed_ranks=[1]" in text
        assert "bad value 42" in text
