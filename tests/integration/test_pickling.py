"""What travels: meshes as arguments, functions and classes, numpy arrays."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from danaus.actor import (
    Actor,
    ActorMesh,
    ProcMesh,
    context,
    current_rank,
    endpoint,
    this_host,
)

from .conftest import REPLY_TIMEOUT


class Target(Actor):
    def __init__(self) -> None:
        self.calls: list[str] = []

    @endpoint
    def whoami(self, who: str) -> tuple[int, int]:
        self.calls.append(who)
        return context().actor_instance.rank.rank, os.getpid()

    @endpoint
    def calls_seen(self) -> list[str]:
        return list(self.calls)


class Caller(Actor):
    """Calls whatever mesh it is given, from its own proc."""

    @endpoint
    def call_all(self, target: Any) -> list[tuple[int, int]]:
        return list(target.whoami.call(f"caller-{os.getpid()}").get(timeout=REPLY_TIMEOUT).values())

    @endpoint
    def call_one(self, target: Any) -> tuple[int, int]:
        return target.whoami.call_one(f"caller-{os.getpid()}").get(timeout=REPLY_TIMEOUT)

    @endpoint
    def broadcast_then_count(self, target: Any) -> list[list[str]]:
        target.whoami.broadcast("broadcast")
        return list(target.calls_seen.call().get(timeout=REPLY_TIMEOUT).values())

    @endpoint
    def spawn_on(self, procs: Any) -> Any:
        """Spawn on a proc mesh received as an argument, and hand the new mesh back."""
        spawned = procs.spawn("spawned_remotely", Target)
        spawned.initialized.get(timeout=REPLY_TIMEOUT)
        return spawned

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Apply(Actor):
    @endpoint
    def apply(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    @endpoint
    def build(self, cls: type, *args: Any) -> Any:
        return cls(*args)

    @endpoint
    def echo(self, x: Any) -> Any:
        return x

    @endpoint
    def describe_array(self, arr: np.ndarray) -> tuple[str, tuple[int, ...], str]:
        return str(arr.dtype), arr.shape, _digest(arr)

    @endpoint
    def scaled(self, arr: np.ndarray, k: int) -> np.ndarray:
        return arr * k


def _digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def square(x: int) -> int:
    return x * x


class Point3:
    def __init__(self, x: int, y: int, z: int) -> None:
        self.x, self.y, self.z = x, y, z

    def norm1(self) -> int:
        return abs(self.x) + abs(self.y) + abs(self.z)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point3) and (self.x, self.y, self.z) == (other.x, other.y, other.z)


@pytest.fixture(scope="module")
def other_procs() -> Iterator[ProcMesh]:
    pm = this_host().spawn_procs(per_host={"hosts": 1}, name="other")
    yield pm
    pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def targets(procs: ProcMesh) -> Iterator[ActorMesh[Target]]:
    mesh = procs.spawn("targets", Target)
    yield mesh
    mesh.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def caller(other_procs: ProcMesh) -> Iterator[ActorMesh[Caller]]:
    mesh = other_procs.spawn("caller", Caller)
    yield mesh
    mesh.stop().get(timeout=REPLY_TIMEOUT)


@pytest.fixture(scope="module")
def applier(procs: ProcMesh) -> Iterator[ActorMesh[Apply]]:
    mesh = procs.spawn("applier", Apply)
    yield mesh
    mesh.stop().get(timeout=REPLY_TIMEOUT)


# -- meshes as arguments ------------------------------------------------------------


def test_actor_mesh_passed_to_an_actor_on_another_proc_mesh_can_be_called(targets, caller) -> None:
    caller_pid = caller.pid.call_one().get(timeout=REPLY_TIMEOUT)
    results = caller.call_all.call_one(targets).get(timeout=REPLY_TIMEOUT)
    local = list(targets.whoami.call("client").get(timeout=REPLY_TIMEOUT).values())
    assert [rank for rank, _ in results] == [0, 1]
    assert [pid for _, pid in results] == [pid for _, pid in local]
    assert caller_pid not in [pid for _, pid in results]


def test_a_slice_passed_as_an_argument_addresses_only_the_slice(targets, caller) -> None:
    rank, pid = caller.call_one.call_one(targets.slice(gpus=1)).get(timeout=REPLY_TIMEOUT)
    _, pid1 = targets.slice(gpus=1).whoami.call_one("client").get(timeout=REPLY_TIMEOUT)
    assert (rank, pid) == (1, pid1)


def test_broadcast_through_a_received_mesh_stays_in_order_with_calls(procs, caller) -> None:
    fresh = procs.spawn("fresh_targets", Target)
    seen = caller.broadcast_then_count.call_one(fresh).get(timeout=REPLY_TIMEOUT)
    assert seen == [["broadcast"], ["broadcast"]]
    fresh.stop().get(timeout=REPLY_TIMEOUT)


def test_mesh_survives_a_pickle_round_trip_in_the_client(targets) -> None:
    copy = pickle.loads(pickle.dumps(targets.slice(gpus=0)))
    assert copy.sizes == {}
    assert copy.whoami.call_one("copy").get(timeout=REPLY_TIMEOUT)[0] == 0


def test_proc_mesh_passed_to_an_actor_can_be_spawned_on_and_the_mesh_returned(
    procs, caller
) -> None:
    spawned = caller.spawn_on.call_one(procs).get(timeout=REPLY_TIMEOUT)
    assert isinstance(spawned, ActorMesh)
    assert spawned.sizes == {"gpus": 2}
    results = list(spawned.whoami.call("client").get(timeout=REPLY_TIMEOUT).values())
    targets_pids = [
        pid
        for _, pid in procs.spawn("pid_probe", Target)
        .whoami.call("x")
        .get(timeout=REPLY_TIMEOUT)
        .values()
    ]
    assert [pid for _, pid in results] == targets_pids


# -- functions and classes --------------------------------------------------------------


def test_functions_defined_in_the_test_module_travel_as_arguments(applier) -> None:
    one = applier.slice(gpus=0)
    assert one.apply.call_one(square, 9).get(timeout=REPLY_TIMEOUT) == 81
    assert one.apply.call_one(lambda a, b: a - b, 10, 4).get(timeout=REPLY_TIMEOUT) == 6
    offset = 100

    def closure(x: int) -> int:
        return x + offset

    assert one.apply.call_one(closure, 1).get(timeout=REPLY_TIMEOUT) == 101


def test_classes_defined_in_the_test_module_travel_both_ways(applier) -> None:
    p = applier.slice(gpus=1).build.call_one(Point3, 1, -2, 3).get(timeout=REPLY_TIMEOUT)
    assert isinstance(p, Point3)
    assert p == Point3(1, -2, 3)
    assert applier.slice(gpus=1).apply.call_one(Point3.norm1, p).get(timeout=REPLY_TIMEOUT) == 6


def test_class_defined_inside_a_test_function_works_as_an_actor(procs) -> None:
    class LocalActor(Actor):
        def __init__(self, base: int) -> None:
            self.base = base

        @endpoint
        def plus_rank(self) -> int:
            return self.base + current_rank().rank

    mesh = procs.spawn("local_actor", LocalActor, 40)
    assert list(mesh.plus_rank.call().get(timeout=REPLY_TIMEOUT).values()) == [40, 41]
    mesh.stop().get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(60)
def test_class_and_function_defined_in_a_main_script_work_as_actor_and_argument(
    client_script,
) -> None:
    result = client_script.run(
        """
        import json, os
        from danaus.actor import Actor, endpoint, this_host

        def triple(x):
            return 3 * x

        class Box:
            def __init__(self, v):
                self.v = v

        class MainActor(Actor):
            def __init__(self, box):
                self.box = box

            @endpoint
            def run(self, fn):
                return fn(self.box.v), type(self.box).__module__, os.getpid()

        procs = this_host().spawn_procs(per_host={"gpus": 2})
        mesh = procs.spawn("main_actor", MainActor, Box(7))
        values = list(mesh.run.call(triple).get(timeout=30).values())
        procs.stop().get(timeout=30)
        print(json.dumps({"values": values, "client": os.getpid()}))
        """
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert [v[:2] for v in out["values"]] == [[21, "__main__"], [21, "__main__"]]
    assert out["client"] not in [v[2] for v in out["values"]]


# -- numpy ------------------------------------------------------------------------------


def test_four_mib_numpy_array_round_trips_exactly(applier) -> None:
    rng = np.random.default_rng(0)
    arr = rng.standard_normal(1 << 20).astype(np.float32)  # 4 MiB
    assert arr.nbytes == 4 * 1024 * 1024
    back = applier.slice(gpus=0).echo.call_one(arr).get(timeout=REPLY_TIMEOUT)
    assert isinstance(back, np.ndarray)
    assert back.dtype == np.float32
    assert back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(2 * 3 * 4096, dtype=np.int16).reshape(2, 3, 4096),
        np.arange(4096, dtype=np.float64).reshape(64, 64).T,  # Fortran-ordered view
        np.arange(1 << 14, dtype=np.float32)[::3],  # non-contiguous
        np.arange(10, dtype=np.uint8),  # small: in band
        np.zeros((0, 5), dtype=np.complex64),
        np.array([("a", 1.5)], dtype=[("name", "U4"), ("w", "f8")]),
    ],
    ids=["int16-3d", "transposed", "strided", "small", "empty", "structured"],
)
def test_numpy_arrays_keep_dtype_shape_and_values(applier, arr: np.ndarray) -> None:
    dtype, shape, digest = (
        applier.slice(gpus=1).describe_array.call_one(arr).get(timeout=REPLY_TIMEOUT)
    )
    assert (dtype, tuple(shape)) == (str(arr.dtype), arr.shape)
    assert digest == _digest(arr)
    back = applier.slice(gpus=1).echo.call_one(arr).get(timeout=REPLY_TIMEOUT)
    assert back.dtype == arr.dtype
    assert back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)


def test_numpy_array_sent_to_every_rank_and_computed_on(applier) -> None:
    arr = np.arange(1 << 20, dtype=np.int32)
    results = applier.scaled.call(arr, 3).get(timeout=REPLY_TIMEOUT)
    for value in results.values():
        np.testing.assert_array_equal(value, arr * 3)


def test_received_numpy_array_is_writable_by_the_caller(applier) -> None:
    arr = np.ones(1 << 16, dtype=np.float32)
    back = applier.slice(gpus=0).echo.call_one(arr).get(timeout=REPLY_TIMEOUT)
    back[0] = 5.0  # a read-only view of the frame would raise here
    assert back[0] == 5.0
    assert arr[0] == 1.0
