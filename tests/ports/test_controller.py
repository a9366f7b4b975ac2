"""``get_or_spawn_controller``: one singleton actor per name, in the client (issue 6)."""

from __future__ import annotations

import os
import uuid

import pytest

from danaus.actor import Actor, ProcMesh, endpoint, get_or_spawn_controller

from .conftest import TIMEOUT


class Registry(Actor):
    def __init__(self, label: str) -> None:
        self.label = label
        self.token = uuid.uuid4().hex
        self.count = 0

    @endpoint
    def identity(self) -> tuple[str, str, int]:
        return self.label, self.token, os.getpid()

    @endpoint
    def incr(self) -> int:
        self.count += 1
        return self.count


class User(Actor):
    """Reaches a controller from inside an actor."""

    @endpoint
    def controller_identity(self, name: str) -> tuple[str, str, int]:
        controller = get_or_spawn_controller(name, Registry, "from an actor").get(timeout=TIMEOUT)
        return controller.identity.call_one().get(timeout=TIMEOUT)

    @endpoint
    def incr(self, name: str) -> int:
        controller = get_or_spawn_controller(name, Registry, "from an actor").get(timeout=TIMEOUT)
        return controller.incr.call_one().get(timeout=TIMEOUT)


def fresh_name() -> str:
    return f"registry-{uuid.uuid4().hex[:8]}"


def test_the_same_name_gives_the_same_actor_running_in_the_client() -> None:
    name = fresh_name()
    first = get_or_spawn_controller(name, Registry, "first").get(timeout=TIMEOUT)
    second = get_or_spawn_controller(name, Registry, "ignored").get(timeout=TIMEOUT)
    a = first.identity.call_one().get(timeout=TIMEOUT)
    b = second.identity.call_one().get(timeout=TIMEOUT)
    assert a == b
    assert a[0] == "first"  # later arguments are ignored
    assert a[2] == os.getpid()  # the controller lives in the client


def test_different_names_give_different_actors() -> None:
    a = get_or_spawn_controller(fresh_name(), Registry, "a").get(timeout=TIMEOUT)
    b = get_or_spawn_controller(fresh_name(), Registry, "b").get(timeout=TIMEOUT)
    assert (
        a.identity.call_one().get(timeout=TIMEOUT)[1]
        != b.identity.call_one().get(timeout=TIMEOUT)[1]
    )


def test_a_controller_is_reachable_from_inside_an_actor(procs: ProcMesh) -> None:
    name = fresh_name()
    mine = get_or_spawn_controller(name, Registry, "client").get(timeout=TIMEOUT)
    users = procs.spawn("users", User)
    seen = users.controller_identity.call(name).get(timeout=TIMEOUT)
    expected = mine.identity.call_one().get(timeout=TIMEOUT)
    assert list(seen.values()) == [expected, expected]
    assert expected[2] == os.getpid()
    # State is shared: one actor behind every lookup.
    users.incr.call(name).get(timeout=TIMEOUT)
    assert mine.incr.call_one().get(timeout=TIMEOUT) == 3
    users.stop().get(timeout=TIMEOUT)


def test_get_or_spawn_controller_needs_a_name() -> None:
    with pytest.raises(TypeError):
        get_or_spawn_controller("", Registry, "x")


def test_a_controller_first_requested_by_an_actor_still_lives_in_the_client(
    procs: ProcMesh,
) -> None:
    name = fresh_name()
    user = procs.slice(gpus=1).spawn("user", User)
    label, token, pid = user.controller_identity.call_one(name).get(timeout=TIMEOUT)
    assert (label, pid) == ("from an actor", os.getpid())
    mine = get_or_spawn_controller(name, Registry, "client").get(timeout=TIMEOUT)
    assert mine.identity.call_one().get(timeout=TIMEOUT) == (label, token, pid)
    user.stop().get(timeout=TIMEOUT)
