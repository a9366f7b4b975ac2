"""A supervisor's decisions, without a runtime: which ranks a strategy restarts, when the
restart intensity makes it give up, and how calls held for a restart are let go.

The supervisors are real ``Supervisor`` objects; only their owner (``context()``) and
their node (with its registry, ``node.part(Supervised)``) are stand-ins, and their children are
``_MeshChild`` records of meshes that were never spawned. The restart itself
(stopping, placing, spawning) is recorded instead of done: that part is across
processes (tests/supervision).
"""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest

import danaus._supervision.supervisor as supervisor_mod
import danaus._supervision.tree as tree_mod
from danaus._actor.api.mesh import MeshRef
from danaus._mesh import Shape, Slice
from danaus._supervision.policy import retry_delay
from danaus._supervision.supervised import Supervised
from danaus._supervision.supervisor import Backoff, Restart, Supervisor, _MeshChild
from danaus._wire.ids import ActorId, ProcId


class Clock:
    """``time`` for the supervisor module: ``monotonic()`` is what the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_000_000.0 + self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Supervisors made in this test have a stand-in owner and registry, and this clock."""
    owner = ActorId(ProcId("client", "unix:/tmp/client"), "client", 0)
    registry = Supervised()
    # The owner's node: its registry, and a runtime with no trace running.
    node = types.SimpleNamespace(
        part=lambda cls: registry, runtime=types.SimpleNamespace(tracer=None)
    )
    ctx = types.SimpleNamespace(
        actor_instance=types.SimpleNamespace(actor_id=owner, _home=lambda: node),
        message_rank=None,
    )
    monkeypatch.setattr(supervisor_mod, "context", lambda: ctx)
    monkeypatch.setattr(supervisor_mod, "Context", lambda *a: ctx)
    c = Clock()
    monkeypatch.setattr(supervisor_mod, "time", c)
    return c


def child(sup: Supervisor, name: str, size: int) -> _MeshChild:
    """A mesh child of ``sup`` with ``size`` ranks (one proc each), added in spawn order."""
    procs = tuple(ProcId(f"{name}-proc{r}", "unix:/tmp/p") for r in range(size))
    ref = MeshRef(f"{name}.000000", name, object, procs, None)
    shape = Shape(["procs"], Slice.new_row_major([size]))
    c = _MeshChild(ref, types.SimpleNamespace(failed={}), shape)
    sup._children.append(c)
    return c


class Recorded:
    """What a supervisor's ``_handle`` did: restarts made (targets) and give-ups."""

    def __init__(self, sup: Supervisor) -> None:
        self.restarts: list[dict[str, set[int]]] = []
        self.gave_up: list[list[str]] = []

        def restart(targets: dict[_MeshChild, set[int]], reason: str) -> dict[Any, set[int]]:
            self.restarts.append({m.name: ranks for m, ranks in targets.items()})
            return {}  # every rank found a host

        sup._restart = restart  # type: ignore[method-assign]
        sup._announce = lambda rec, targets: None  # type: ignore[method-assign]
        sup._give_up = lambda failures, why=None: self.gave_up.append(failures)  # type: ignore[method-assign]


def _names(affected: dict[_MeshChild, set[int]]) -> dict[str, set[int]]:
    return {m.name: ranks for m, ranks in affected.items()}


# -- which ranks a strategy restarts ------------------------------------------------------


def test_one_for_one_restarts_only_the_failed_ranks(clock: Clock) -> None:
    sup = Supervisor("one_for_one")
    a, b, _ = child(sup, "a", 2), child(sup, "b", 3), child(sup, "c", 1)
    assert _names(sup._affected(b, {1})) == {"b": {1}}
    assert _names(sup._affected(a, {0, 1})) == {"a": {0, 1}}


def test_one_for_all_restarts_every_rank_of_every_child_not_stopped(clock: Clock) -> None:
    sup = Supervisor("one_for_all")
    a, b, c = child(sup, "a", 2), child(sup, "b", 3), child(sup, "c", 1)
    assert _names(sup._affected(b, {1})) == {"a": {0, 1}, "b": {0, 1, 2}, "c": {0}}
    a.stopped = True  # stopped by its user: never restarted
    assert _names(sup._affected(c, {0})) == {"b": {0, 1, 2}, "c": {0}}


def test_rest_for_one_restarts_the_failed_child_whole_and_every_later_one(clock: Clock) -> None:
    sup = Supervisor("rest_for_one")
    a, b, c = child(sup, "a", 2), child(sup, "b", 3), child(sup, "c", 1)
    assert _names(sup._affected(b, {2})) == {"b": {0, 1, 2}, "c": {0}}
    assert _names(sup._affected(a, {0})) == {"a": {0, 1}, "b": {0, 1, 2}, "c": {0}}
    # the last child: only itself, but all of its ranks
    assert _names(sup._affected(c, {0})) == {"c": {0}}


def test_a_nested_supervisor_is_restarted_whole_whatever_the_strategy(clock: Clock) -> None:
    top = Supervisor("one_for_one", name="top")
    first = child(top, "first", 1)
    sub = top.supervisor("one_for_one", name="sub")
    d, e = child(sub, "d", 2), child(sub, "e", 1)
    later = child(top, "later", 2)
    assert sub._parent is top and sub._tree is top._tree  # one thread for the tree
    assert _names(top._affected(sub, set())) == {"d": {0, 1}, "e": {0}}
    rest = Supervisor("rest_for_one", name="rest")
    rest._children = [first, sub, later]
    assert _names(rest._affected(sub, set())) == {"d": {0, 1}, "e": {0}, "later": {0, 1}}
    assert [m.name for m in top.mesh_children()] == ["first", "d", "e", "later"]
    assert sub._children == [d, e]  # they belong to the nested supervisor


def test_a_failure_holds_the_ranks_the_strategy_will_restart(clock: Clock) -> None:
    sup = Supervisor("rest_for_one")
    a, b = child(sup, "a", 2), child(sup, "b", 2)
    sup._tree.start_locked = lambda: None  # type: ignore[method-assign]  # no thread: the test looks
    assert sup._on_failure(a, 1, "boom", "", ()) is True
    assert (a.blocked, b.blocked) == ({0, 1}, {0, 1})
    (event,) = sup._tree.events
    assert event[:4] == (sup, a, {1: 0}, "boom")
    b.stopped = True
    assert sup._on_failure(b, 0, "boom", "", ()) is False  # stopped: its owner hears


# -- restart intensity --------------------------------------------------------------------


def test_more_than_max_restarts_within_the_period_gives_up_naming_every_failure(
    clock: Clock,
) -> None:
    sup = Supervisor("one_for_one", max_restarts=2, period=10.0)
    a = child(sup, "a", 2)
    rec = Recorded(sup)
    for t, rank in ((0.0, 0), (1.0, 1)):
        clock.now = t
        sup._handle(a, {rank: a.incarnation[rank]}, f"crash {rank}", t)
    assert rec.restarts == [{"a": {0}}, {"a": {1}}] and rec.gave_up == []
    assert [(r.child, r.ranks, r.reason) for r in sup.restarts] == [
        ("a", (0,), "crash 0"),
        ("a", (1,), "crash 1"),
    ]
    clock.now = 2.0
    sup._handle(a, {0: a.incarnation[0]}, "crash again", 2.0)
    assert len(rec.restarts) == 2
    assert rec.gave_up == [["a[0]: crash 0", "a[1]: crash 1", "a[0]: crash again"]]


def test_restarts_older_than_the_period_no_longer_count(clock: Clock) -> None:
    sup = Supervisor("one_for_one", max_restarts=1, period=10.0)
    a = child(sup, "a", 1)
    rec = Recorded(sup)
    for t in (0.0, 10.5, 21.0):  # one restart per period: always allowed
        clock.now = t
        sup._handle(a, {0: a.incarnation[0]}, "crash", t)
    assert len(rec.restarts) == 3 and rec.gave_up == []
    clock.now = 22.0  # the second within 10 s
    sup._handle(a, {0: a.incarnation[0]}, "crash", 22.0)
    assert len(rec.restarts) == 3 and rec.gave_up == [["a[0]: crash", "a[0]: crash"]]


def test_a_failure_of_an_incarnation_already_restarted_is_not_restarted_again(
    clock: Clock,
) -> None:
    sup = Supervisor("one_for_all")
    a, b = child(sup, "a", 2), child(sup, "b", 1)
    rec = Recorded(sup)
    seen = {1: a.incarnation[1]}
    a.incarnation[1] += 1  # restarted meanwhile (by the restart another failure caused)
    sup._handle(a, seen, "old news", 0.0)
    assert rec.restarts == []
    sup._handle(b, {0: b.incarnation[0]}, "new", 0.0)
    assert rec.restarts == [{"a": {0, 1}, "b": {0}}]
    sup._status = "stopped"
    sup._handle(b, {0: b.incarnation[0]}, "after stop", 0.0)
    assert len(rec.restarts) == 1


def test_a_restarted_nested_supervisor_starts_afresh(clock: Clock) -> None:
    top = Supervisor("one_for_one", name="top")
    sub = top.supervisor("one_for_one", max_restarts=1, name="sub")
    d = child(sub, "d", 1)
    Recorded(top)
    sub._history.append(0.0)
    sub._status = "gave up"
    top._handle(sub, {-1: sub._generation}, "sub gave up", 0.0)
    assert (sub._status, sub._generation, list(sub._history)) == ("running", 1, [])
    # a second report of the generation it had is stale now
    rec = Recorded(top)
    top._handle(sub, {-1: 0}, "sub gave up", 0.0)
    assert rec.restarts == [] and d.incarnation == [0]


# -- held calls ---------------------------------------------------------------------------


def test_held_calls_are_sent_in_order_once_their_ranks_are_up(clock: Clock) -> None:
    sup = Supervisor()
    m = child(sup, "m", 3)
    sent: list[str] = []

    def hold(name: str, *ranks: int) -> bool:
        return m.hold(frozenset(ranks), lambda: sent.append(name))

    assert hold("early", 0) is False  # nothing restarting: sent at once by its caller
    m.block({0, 1})
    assert hold("a", 0) is True
    assert hold("b", 2) is False  # rank 2 is neither restarting nor waited for
    assert hold("c", 0, 2) is True  # now rank 2 is waited for...
    assert hold("d", 2) is True  # ...so a later call to it queues behind "c"
    assert hold("e", 1) is True
    m.release({1})  # rank 0 still restarting: only what waits for neither it nor a queued call
    assert sent == ["e"]
    assert (m.blocked, m.held) == ({0}, frozenset({0, 2}))
    m.release({0})
    assert sent == ["e", "a", "c", "d"]  # in the order they were made
    assert m.held == frozenset() and not m.pending


def test_a_held_call_that_raises_does_not_keep_the_others_back(clock: Clock) -> None:
    sup = Supervisor()
    a = child(sup, "a", 1)
    sent: list[str] = []
    a.block({0})

    def bad() -> None:
        raise RuntimeError("send failed")

    a.hold(frozenset({0}), bad)
    a.hold(frozenset({0}), lambda: sent.append("after"))
    a.release()
    assert sent == ["after"]


def test_failures_reported_meanwhile_are_handled_by_the_trees_thread_in_order(
    clock: Clock,
) -> None:
    """``_on_failure`` only queues; the tree's thread restarts, then lets held calls go."""
    sup = Supervisor("one_for_one", name="threaded")
    a = child(sup, "a", 2)
    rec = Recorded(sup)
    done = threading.Event()
    sent: list[str] = []
    sup._restart = lambda targets, reason: (  # type: ignore[method-assign]
        rec.restarts.append(_names(targets)),
        [m.release(r) for m, r in targets.items()],
    )
    a.block({1})
    a.hold(frozenset({1}), lambda: (sent.append("held"), done.set()))
    assert sup._on_failure(a, 1, "crash", "", ()) is True
    assert done.wait(30)
    assert rec.restarts == [{"a": {1}}] and sent == ["held"]
    sup._tree.end()
    thread = sup._tree.thread
    assert thread is not None
    thread.join(30)
    assert not thread.is_alive()


# -- settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"strategy": "all_for_one"}, ValueError, "strategy must be one of 'one_for_one'"),
        ({"max_restarts": -1}, ValueError, "max_restarts must be an int >= 0"),
        ({"max_restarts": True}, ValueError, "max_restarts must be an int >= 0"),
        ({"period": 0}, ValueError, "period must be a number of seconds > 0"),
        ({"period": float("nan")}, ValueError, "period must be a number of seconds > 0"),
        ({"backoff": (1.0,)}, ValueError, r"backoff must be \(initial, cap\)"),
        ({"backoff": 1.0}, TypeError, "backoff must be a Backoff"),
        ({"spare_hosts": [1, 2]}, TypeError, "spare_hosts must be a HostMesh"),
        ({"name": ""}, TypeError, "name must be a non-empty string"),
    ],
)
def test_a_supervisor_refuses_bad_settings_naming_them(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Supervisor(**kwargs)


def test_backoff_doubles_per_earlier_restart_up_to_its_cap() -> None:
    b = Backoff(0.5, 3.0)
    assert [b.delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert Backoff(0, 0).delay(10_000) == 0.0  # no overflow for long histories
    with pytest.raises(ValueError, match=r"cap .* must be at least its initial delay"):
        Backoff(2.0, 1.0)
    with pytest.raises(ValueError, match="initial must be >= 0"):
        Backoff(-1.0, 1.0)
    with pytest.raises(TypeError, match="cap must be a number of seconds"):
        Backoff(1.0, float("inf"))


def test_a_restart_record_reads_as_a_dict() -> None:
    r = Restart(5.0, "a", (0, 2), "crash", 0.5, 4.0, "sup")
    assert r.as_dict() == {
        "time": 5.0, "child": "a", "ranks": [0, 2], "reason": "crash",
        "delay": 0.5, "failed_at": 4.0, "supervisor": "sup",
    }  # fmt: skip


def test_describe_shows_the_tree_for_the_dashboard(clock: Clock) -> None:
    top = Supervisor("rest_for_one", max_restarts=5, period=30, name="top")
    child(top, "a", 1)
    sub = top.supervisor(name="sub")
    assert top.describe() == {
        "name": "top", "strategy": "rest_for_one", "max_restarts": 5, "period": 30.0,
        "status": "running", "parent": None, "children": ["a", "sub"], "restarts": [],
    }  # fmt: skip
    assert sub.describe()["parent"] == "top"
    assert "rest_for_one" in repr(top) and "2 children" in repr(top)


# -- no host for a rank: tries again with a backoff, never in a tight loop ------------------


def test_the_wait_between_tries_to_place_doubles_up_to_its_cap() -> None:
    assert [retry_delay(n, 0.5, 30.0) for n in range(9)] == [
        0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0,
    ]  # fmt: skip
    assert retry_delay(10_000, 0.5, 30.0) == 30.0  # no overflow however many tries


def test_a_rank_no_host_takes_stays_failed_and_is_tried_again_after_a_growing_wait(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No host for rank 1 (its host gone, no spare): the supervisor does not try again at
    once (it did, hundreds of times a second), but after 0.5 s, 1 s, 2 s... of the fake
    clock; calls to the rank fail meanwhile (it stays failed, saying why); once a host
    takes it, the next rank without a host waits 0.5 s again."""
    monkeypatch.setattr(tree_mod, "time", clock)
    sup = Supervisor("one_for_all", max_restarts=100, period=60.0)
    sup._tree.start_locked = lambda: None  # type: ignore[method-assign]  # the test is the thread
    a, _ = child(sup, "a", 2), child(sup, "b", 1)
    a.state = types.SimpleNamespace(failed={1: "its host died"}, lock=threading.Lock())
    tried: list[tuple[float, dict[str, set[int]]]] = []
    free_hosts = 0

    def restart(targets: dict[_MeshChild, set[int]], reason: str) -> dict[Any, set[int]]:
        tried.append((clock.now, {m.name: set(r) for m, r in targets.items()}))
        if free_hosts:
            return {}
        return {a: {1}} if a in targets else {}

    sup._restart = restart  # type: ignore[method-assign]
    sup._handle(a, {1: a.incarnation[1]}, "its host died", 0.0)
    # The strategy's first restart covers everything; rank 1 found no host.
    assert tried == [(0.0, {"a": {0, 1}, "b": {0}})]
    assert sup.restarts[0].ranks == () and sup.restarts[0].child == "a"
    assert "tries again in 0.5 s" in a.state.failed[1]
    waits = []
    for _ in range(6):
        ((due, _, _),) = sup._tree.delayed
        waits.append(due - clock.now)
        clock.now = due - 0.01  # not yet due: nothing is tried
        assert sup._tree.due_locked(clock.now) == pytest.approx(0.01)
        assert not sup._tree.events
        clock.now = due
        assert sup._tree.due_locked(clock.now) is None
        sup._handle(*sup._tree.events.popleft()[1:])
        # A try again is of the rank no host took only, not the strategy's whole restart.
        assert tried[-1] == (clock.now, {"a": {1}})
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
    assert len(tried) == 7 and len(sup.restarts) == 1  # tries that placed nothing: no record
    free_hosts = 1  # a host is back: the next try places it
    ((due, _, _),) = sup._tree.delayed
    clock.now = due
    sup._tree.due_locked(clock.now)
    a.state.failed.pop(1)  # as _restart does for a rank it placed
    a.state.failed[1] = "still failed until placed"
    sup._handle(*sup._tree.events.popleft()[1:])
    assert sup._tree.delayed == [] and sup.restarts[-1].ranks == (1,)
    assert sup._unplaced_tries == 0  # the next rank without a host waits 0.5 s again


def test_tries_that_place_nothing_count_toward_the_intensity(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tree_mod, "time", clock)
    sup = Supervisor("one_for_one", max_restarts=3, period=60.0)
    sup._tree.start_locked = lambda: None  # type: ignore[method-assign]
    a = child(sup, "a", 1)
    a.state = types.SimpleNamespace(failed={0: "host died"}, lock=threading.Lock())
    gave_up: list[list[str]] = []
    sup._restart = lambda targets, reason: {a: {0}}  # type: ignore[method-assign]
    sup._give_up = lambda failures, why=None: gave_up.append(failures)  # type: ignore[method-assign]
    sup._handle(a, {0: 0}, "host died", 0.0)
    for _ in range(3):
        ((due, _, _),) = sup._tree.delayed
        clock.now = due
        sup._tree.due_locked(clock.now)
        sup._handle(*sup._tree.events.popleft()[1:])
    # 3 tries within the period, then the 4th exceeds it: the owner hears, no more tries.
    assert len(gave_up) == 1 and len(gave_up[0]) == 4
