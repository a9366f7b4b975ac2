"""A replica's side of the membership protocol, without torch or a process: who is in
a membership, aborts that overtake their join, and the checks of ``ElasticMesh``."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danaus._elastic.mesh import ElasticMesh
from danaus._elastic.replica import (
    ElasticReplica,
    Membership,
    MembershipChanged,
    _Epoch,
)


@given(n=st.integers(0, 200), world=st.integers(1, 17))
def test_the_shards_of_a_membership_cover_every_item_once(n: int, world: int) -> None:
    shards = [Membership(0, rank, world, rank).shard(n) for rank in range(world)]
    items = sorted(i for s in shards for i in s)
    assert items == list(range(n))
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1  # balanced


def test_an_abort_wakes_a_waiting_collective_with_membership_changed() -> None:
    ep = _Epoch(Membership(3, 0, 2, 7))
    never = threading.Event()
    waiting, errors = threading.Event(), []

    def collective() -> None:
        waiting.set()
        try:
            ep.wait(never, "all_reduce")
        except MembershipChanged as e:
            errors.append(str(e))

    t = threading.Thread(target=collective)
    t.start()
    assert waiting.wait(30)
    ep.abort("replica 1 lost")  # wakes it whether or not it already waits
    t.join(30)
    assert not t.is_alive()
    assert errors == ["all_reduce: membership 3 ended (replica 1 lost)"]


def test_a_wait_after_the_abort_fails_at_once_and_a_finished_one_returns() -> None:
    ep = _Epoch(Membership(0, 0, 1, 0))
    done = threading.Event()
    done.set()
    ep.wait(done, "all_reduce")  # finished before any abort: returns
    ep.abort("gone")
    with pytest.raises(MembershipChanged, match="membership 0 ended"):
        ep.wait(threading.Event(), "forming membership 0")


class _Work:
    """A gloo work as ``_Epoch.wait_work`` sees it: ``wait(timeout)`` raises "Operation
    timed out!" while it runs, then returns (or raises ``error``) once ``end`` is called."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: Exception | None = None
        self.waits = 0
        self.waiting = threading.Event()  # a first slice began
        self.sliced = threading.Event()  # a slice ran out and the next one began

    def end(self, error: Exception | None = None) -> None:
        self.error = error
        self.done.set()

    def is_completed(self) -> bool:
        return self.done.is_set()

    def wait(self, timeout: Any) -> bool:
        self.waits += 1
        self.waiting.set()
        if self.waits >= 2:
            self.sliced.set()
        if not self.done.wait(timeout.total_seconds()):
            raise RuntimeError("Operation timed out!")
        if self.error is not None:
            raise self.error
        return True


def _wait_on_thread(ep: _Epoch, work: _Work) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            ep.wait_work(work, "all_reduce")
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, errors


def test_a_collective_is_waited_for_on_the_calling_thread_until_it_ends_or_fails() -> None:
    ep = _Epoch(Membership(2, 0, 2, 0))
    work = _Work()
    t, errors = _wait_on_thread(ep, work)
    assert work.sliced.wait(30)  # a slice ran out: it keeps waiting
    work.end()
    t.join(30)
    assert not t.is_alive() and errors == []

    failing = _Work()
    t, errors = _wait_on_thread(ep, failing)
    failing.end(RuntimeError("Connection closed by peer [127.0.0.1]:1234"))
    t.join(30)
    assert not t.is_alive()
    assert [str(e) for e in errors] == [
        "all_reduce failed: Connection closed by peer [127.0.0.1]:1234"
    ]
    assert isinstance(errors[0], MembershipChanged)


def test_an_abort_ends_the_wait_for_a_collective_that_never_ends() -> None:
    ep = _Epoch(Membership(4, 1, 3, 5))
    work = _Work()  # the lost peer's share never comes
    t, errors = _wait_on_thread(ep, work)
    assert work.waiting.wait(30)
    ep.abort("replicas [2] lost")
    t.join(30)
    assert not t.is_alive() and not work.is_completed()
    assert [str(e) for e in errors] == ["all_reduce: membership 4 ended (replicas [2] lost)"]


class _Store:
    def __init__(self) -> None:
        self.closed: list[str] = []

    def close(self, why: str) -> None:
        self.closed.append(why)


def test_an_abort_closes_the_membership_store_before_or_after_it_is_attached() -> None:
    ep = _Epoch(Membership(1, 0, 2, 0))
    store = _Store()
    ep.attach_store(store)
    assert store.closed == []
    ep.abort("replicas [1] lost")
    assert store.closed == ["membership 1 ended (replicas [1] lost)"]

    late = _Epoch(Membership(2, 0, 2, 0))
    late.abort("the replica is stopping")  # an abort that overtook the join
    overtaken = _Store()
    late.attach_store(overtaken)
    assert overtaken.closed == ["membership 2 ended (the replica is stopping)"]


class Replica(ElasticReplica):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def echo(self, *args: Any, **kwargs: Any) -> Any:
        return args, kwargs

    def _secret(self) -> None:
        raise AssertionError("never called")


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_replica_outside_a_membership_answers_a_step_with_aborted() -> None:
    r = Replica()
    assert _run(r.elastic_step(0, 1, ())) == ("aborted", "not a member of membership 0")
    with pytest.raises(RuntimeError, match="has not joined a membership yet"):
        r.membership  # noqa: B018


def test_an_abort_ends_its_membership_and_is_kept_for_a_join_it_overtook() -> None:
    r = Replica()
    st_ = r._elastic()
    current = st_.epochs[4] = _Epoch(Membership(4, 0, 2, 0))
    _run(r.elastic_abort(4, "replica 1 lost"))
    with pytest.raises(MembershipChanged, match="all_reduce: membership 4 ended"):
        current.wait(threading.Event(), "all_reduce")
    assert current.why == "replica 1 lost"
    # an abort of a membership this replica has not joined yet is remembered for its join
    _run(r.elastic_abort(5, "replica 2 lost"))
    assert st_.aborted == {4: "replica 1 lost", 5: "replica 2 lost"}
    assert set(st_.epochs) == {4}


def test_a_step_of_an_older_membership_is_refused() -> None:
    r = Replica()
    r._elastic().epoch = _Epoch(Membership(2, 0, 1, 0))
    assert _run(r.elastic_step(1, 0, ())) == ("aborted", "not a member of membership 1")
    assert r.membership == Membership(2, 0, 1, 0)


def test_elastic_call_runs_public_methods_only() -> None:
    r = Replica()
    try:
        assert _run(r.elastic_call("echo", (1,), {"k": 2})) == ((1,), {"k": 2})
        for name in ("_secret", "missing", "seen"):
            with pytest.raises(AttributeError, match=f"no public method '{name}'"):
                _run(r.elastic_call(name, (), {}))
    finally:
        r._elastic().executor.shutdown(wait=True)


def test_the_methods_a_subclass_must_define_say_so() -> None:
    r = Replica()
    for call in (lambda: r.train_step(0), lambda: r.commit(0), r.state):
        with pytest.raises(NotImplementedError, match="Replica must define"):
            call()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"replica": object}, TypeError, "must be an ElasticReplica subclass"),
        ({"replicas": 0}, ValueError, "replicas must be an int >= 1, got 0"),
        ({"replicas": True}, ValueError, "replicas must be an int >= 1"),
        ({"spares": -1}, ValueError, "spares must be an int >= 0, got -1"),
        ({"timeout": 0}, ValueError, "timeout must be a positive number"),
        ({"timeout": float("inf")}, ValueError, "timeout must be a positive number"),
    ],
)
def test_an_elastic_mesh_refuses_bad_arguments_before_it_spawns_anything(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    args: dict[str, Any] = {"replica": Replica, "replicas": 2, **kwargs}
    with pytest.raises(error, match=match):
        ElasticMesh(args.pop("replica"), **args)
