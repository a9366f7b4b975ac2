"""``danaus.supervisor`` (issue 27): OTP's restart strategies, on real processes.

Each actor draws a random token in ``__init__``: a rank restarted has a new
token, a rank left alone keeps its own. Failures are an endpoint raising with
no one to tell (``boom.broadcast()``), ``abort()`` inside a call, or the
proc's SIGKILL; none of them may reach the client's fault hook (the
``faults`` fixture fails the test if one does), unless the supervisor gives up.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from danaus._actor.api.procs import owned_proc_meshes
from danaus.actor import Actor, SupervisionError, context, endpoint
from danaus.supervisor import Backoff, Restart, Supervisor
from danaus.testing import wait_until

from .conftest import TIMEOUT, wait_pids_gone


class Worker(Actor):
    """Records what it is sent; ``init_failures``: a file holding how many more of
    this class's ``__init__`` calls must raise (decremented by each)."""

    def __init__(self, tag: str = "", init_failures: str | None = None) -> None:
        if init_failures is not None:
            left = int(Path(init_failures).read_text())
            if left > 0:
                Path(init_failures).write_text(str(left - 1))
                raise RuntimeError(f"__init__ failing on purpose ({left} left)")
        self.tag = tag
        self.token = secrets.token_hex(4)
        self.seen: list[int] = []

    @endpoint
    def who(self) -> tuple[str, int, str]:
        return self.token, os.getpid(), self.tag

    @endpoint
    def boom(self) -> None:
        raise RuntimeError("boom")

    @endpoint
    def abort_now(self) -> None:
        context().actor_instance.abort("aborted by the test")

    @endpoint
    def record(self, seq: int) -> int:
        self.seen.append(seq)
        return seq

    @endpoint
    def recorded(self) -> list[int]:
        return list(self.seen)

    @endpoint
    def my_threads(self) -> int:
        """How many actor threads of this proc serve this actor's mesh and rank."""
        me = threading.current_thread().name  # "actor-<mesh id>[<rank>]"
        return sum(1 for t in threading.enumerate() if t.name == me)


def tokens(mesh: Any) -> list[str]:
    return [t for t, _, _ in mesh.who.call().get(timeout=TIMEOUT).values()]


def pids(mesh: Any) -> list[int]:
    return [p for _, p, _ in mesh.who.call().get(timeout=TIMEOUT).values()]


def restarted(sup: Supervisor, n: int) -> list[Restart]:
    return wait_until(lambda: sup.restarts, TIMEOUT, f"{n} restarts", until=lambda r: len(r) >= n)


@pytest.fixture
def sups():
    made: list[Supervisor] = []

    def make(**kw: Any) -> Supervisor:
        sup = Supervisor(**kw)
        made.append(sup)
        return sup

    yield make
    for sup in made:
        sup.stop()


def test_one_for_one_restarts_only_the_failed_rank_in_its_own_proc(spawn_procs, sups) -> None:
    procs = spawn_procs(gpus=2)
    sup = sups(strategy="one_for_one", name="sup1")
    workers = sup.spawn(procs, "workers", Worker, "w")
    workers.initialized.get(timeout=TIMEOUT)
    before = workers.who.call().get(timeout=TIMEOUT)

    workers.slice(gpus=1).boom.broadcast()
    (rec,) = restarted(sup, 1)
    assert (rec.child, rec.ranks, rec.supervisor) == ("workers", (1,), "sup1")
    assert "boom" in rec.reason, rec.reason
    after = workers.who.call().get(timeout=TIMEOUT)
    assert after.item(gpus=0) == before.item(gpus=0)  # untouched
    token, pid, tag = after.item(gpus=1)
    assert token != before.item(gpus=1)[0] and tag == "w"  # same constructor arguments
    assert pid == before.item(gpus=1)[1]  # its proc was alive: the same proc
    # The failed actor's thread ended: the restart does not leave it behind.
    wait_until(
        lambda: workers.slice(gpus=1).my_threads.call_one().get(timeout=TIMEOUT),
        TIMEOUT,
        "the failed actor's thread to end",
        until=lambda n: n == 1,
    )

    # Its proc dies: the rank comes back in a new proc on the same host.
    os.kill(pid, signal.SIGKILL)
    rec2 = restarted(sup, 2)[1]
    assert rec2.ranks == (1,) and "failed" in rec2.reason, rec2.reason
    assert wait_pids_gone([pid]) == []
    new_pid = workers.slice(gpus=1).who.call_one().get(timeout=TIMEOUT)[1]
    assert new_pid not in (pid, before.item(gpus=0)[1])
    assert sup.status == "running"


def test_replacement_procs_lost_in_turn_are_let_go(spawn_procs, sups) -> None:
    """Issue 44's soak: every proc a restart spawned stayed held (by the supervisor, the
    node's and the owner's registries) after it was killed in turn; only live ones may."""
    procs = spawn_procs(gpus=1)
    sup = sups(strategy="one_for_one", max_restarts=10)
    workers: Any = sup.spawn(procs, "workers", Worker)
    killed = []
    replacements: set[str] = set()  # every proc a restart spawned
    for n in range(1, 4):
        pid = pids(workers)[0]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        restarted(sup, n)
        replacements |= {p.name for pm in sup._placer.procs for p in pm._procs}
    assert pids(workers)[0] not in killed
    assert wait_pids_gone(killed) == []
    # The last replacement lives; those before it died: each was let go.
    (live,) = [p.name for pm in sup._placer.procs for p in pm._procs]
    assert len(replacements) == 3
    held = {p.name for pm in owned_proc_meshes() for p in pm._procs}
    assert held & replacements == {live}


def test_one_for_all_restarts_every_rank_of_every_child(spawn_procs, sups) -> None:
    procs = spawn_procs(gpus=2)
    sup = sups(strategy="one_for_all")
    a = sup.spawn(procs, "a", Worker)
    b = sup.spawn(procs.slice(gpus=0), "b", Worker)
    before = tokens(a) + tokens(b)
    a.slice(gpus=0).boom.broadcast()
    (rec,) = restarted(sup, 1)
    assert (rec.child, rec.ranks) == ("a", (0,))
    after = tokens(a) + tokens(b)
    assert all(x != y for x, y in zip(before, after, strict=True)), (before, after)


def test_rest_for_one_restarts_the_failed_child_and_those_spawned_after_it(
    spawn_procs, sups
) -> None:
    procs = spawn_procs(gpus=2)
    sup = sups(strategy="rest_for_one")
    first, middle, last = (sup.spawn(procs, n, Worker) for n in ("first", "middle", "last"))
    before = [tokens(m) for m in (first, middle, last)]
    middle.slice(gpus=1).boom.broadcast()
    (rec,) = restarted(sup, 1)
    assert (rec.child, rec.ranks) == ("middle", (1,))
    after = [tokens(m) for m in (first, middle, last)]
    assert after[0] == before[0]
    for old, new in zip(before[1:], after[1:], strict=True):
        assert all(x != y for x, y in zip(old, new, strict=True)), (old, new)


# Which ranks get a fresh actor, per strategy, when the failed child is the only child
# or the last one (issue 44: a shortcut restarted only the failed rank in both cases,
# for every strategy). "all": every rank of that child.
ONLY_CHILD = {"one_for_one": {2}, "one_for_all": "all", "rest_for_one": "all"}
LAST_CHILD = {  # (first child, last child) when rank 1 of the last fails
    "one_for_one": (set(), {1}),
    "one_for_all": ("all", "all"),
    "rest_for_one": (set(), "all"),
}


def fresh_ranks(before: list[str], after: list[str]) -> set[int] | str:
    """The ranks whose actor is new ("all" when every one is)."""
    new = {r for r, (x, y) in enumerate(zip(before, after, strict=True)) if x != y}
    return "all" if new == set(range(len(before))) else new


@pytest.mark.parametrize("strategy", sorted(ONLY_CHILD))
def test_a_failure_in_the_only_child_restarts_what_the_strategy_says(
    spawn_procs, sups, strategy
) -> None:
    procs = spawn_procs(gpus=3)
    sup = sups(strategy=strategy)
    only = sup.spawn(procs, "only", Worker)
    before = only.who.call().get(timeout=TIMEOUT)
    only.slice(gpus=2).boom.broadcast()
    (rec,) = restarted(sup, 1)
    assert (rec.child, rec.ranks) == ("only", (2,))
    after = only.who.call().get(timeout=TIMEOUT)
    toks = lambda vm: [t for t, _, _ in vm.values()]  # noqa: E731
    assert fresh_ranks(toks(before), toks(after)) == ONLY_CHILD[strategy]
    # Every proc was alive: each restarted rank came back in its own proc.
    assert [p for _, p, _ in after.values()] == [p for _, p, _ in before.values()]


@pytest.mark.parametrize("strategy", sorted(LAST_CHILD))
def test_a_failure_in_the_last_child_restarts_what_the_strategy_says(
    spawn_procs, sups, strategy
) -> None:
    procs = spawn_procs(gpus=2)
    sup = sups(strategy=strategy)
    first, last = (sup.spawn(procs, n, Worker) for n in ("first", "last"))
    before = [tokens(first), tokens(last)]
    last.slice(gpus=1).boom.broadcast()
    (rec,) = restarted(sup, 1)
    assert (rec.child, rec.ranks) == ("last", (1,))
    after = [tokens(first), tokens(last)]
    fresh = tuple(fresh_ranks(b, a) for b, a in zip(before, after, strict=True))
    assert fresh == LAST_CHILD[strategy]


def test_restart_intensity_exceeded_gives_up_and_tells_the_owner(spawn_procs, faults) -> None:
    procs = spawn_procs(gpus=2)
    sup = Supervisor(max_restarts=2, period=3600, name="tight")
    workers = sup.spawn(procs, "workers", Worker)
    for n in (1, 2):
        workers.slice(gpus=n - 1).boom.broadcast()
        restarted(sup, n)
        assert len(tokens(workers)) == 2  # up again
    workers.slice(gpus=0).boom.broadcast()  # the third within the period: too many
    (failure,) = faults.wait_until(lambda ev: len(ev) >= 1, "the supervisor giving up")
    assert failure.mesh_name == "tight"
    assert "restart intensity exceeded" in failure.reason, failure.reason
    assert "more than 2 restarts within 3600 s" in failure.reason, failure.reason
    assert failure.reason.count("boom() raised") == 3, failure.reason  # each failure
    assert failure.mesh is sup
    assert sup.status == "gave up" and len(sup.restarts) == 2
    with pytest.raises(SupervisionError):
        workers.who.call().get(timeout=TIMEOUT)
    with pytest.raises(RuntimeError, match="gave up"):
        sup.spawn(procs, "more", Worker)


def test_backoff_waits_before_each_restart_doubling_up_to_its_cap(spawn_procs, sups) -> None:
    procs = spawn_procs(gpus=1)
    sup = sups(max_restarts=10, backoff=Backoff(0.05, 0.15))
    workers = sup.spawn(procs, "workers", Worker)
    for n in range(1, 5):
        workers.boom.broadcast()
        restarted(sup, n)
        tokens(workers)
    delays = [r.delay for r in sup.restarts]
    assert delays == [0.05, 0.1, 0.15, 0.15]
    for r in sup.restarts:
        assert r.time - r.failed_at >= r.delay, r


def test_a_restart_whose_init_fails_is_a_failure_too(spawn_procs, sups, tmp_path) -> None:
    procs = spawn_procs(gpus=1)
    left = tmp_path / "init_failures"
    left.write_text("0")
    sup = sups(max_restarts=5)
    workers = sup.spawn(procs, "workers", Worker, "x", str(left))
    first = tokens(workers)
    left.write_text("2")  # the next two __init__ calls raise
    workers.boom.broadcast()
    recs = restarted(sup, 3)
    assert "boom" in recs[0].reason
    assert all("__init__" in r.reason for r in recs[1:]), [r.reason for r in recs]
    assert left.read_text() == "0"
    assert tokens(workers) != first
    assert len(sup.restarts) == 3


def test_an_init_that_keeps_failing_exhausts_the_intensity(spawn_procs, faults, tmp_path) -> None:
    procs = spawn_procs(gpus=1)
    left = tmp_path / "init_failures"
    left.write_text("100")
    sup = Supervisor(max_restarts=2, name="hopeless")
    workers = sup.spawn(procs, "workers", Worker, "x", str(left))
    (failure,) = faults.wait_until(lambda ev: len(ev) >= 1, "the supervisor giving up")
    assert failure.mesh_name == "hopeless" and "__init__" in failure.reason, failure.reason
    with pytest.raises(SupervisionError):
        workers.initialized.get(timeout=TIMEOUT)


def test_in_flight_calls_fail_later_ones_reach_the_new_actor_in_order(spawn_procs, sups) -> None:
    procs = spawn_procs(gpus=1)
    sup = sups(backoff=Backoff(0.3, 0.3))  # a window in which calls are held
    workers = sup.spawn(procs, "workers", Worker)
    old = tokens(workers)
    workers.record.call_one(-1).get(timeout=TIMEOUT)
    with pytest.raises(SupervisionError):
        workers.abort_now.call_one().get(timeout=TIMEOUT)  # in flight as it failed
    child = workers._child
    wait_until(lambda: child.held or sup.restarts, TIMEOUT, "the supervisor seeing it")
    futures = [workers.record.call_one(i) for i in range(100)]
    assert [f.get(timeout=TIMEOUT) for f in futures] == list(range(100))
    assert workers.recorded.call_one().get(timeout=TIMEOUT) == list(range(100))
    assert tokens(workers) != old


def test_nested_supervisor_that_gives_up_is_restarted_by_its_parent(spawn_procs, sups) -> None:
    procs = spawn_procs(gpus=2)
    parent = sups(strategy="one_for_one", name="parent")
    steady = parent.spawn(procs.slice(gpus=0), "steady", Worker)
    child = parent.supervisor(strategy="one_for_all", max_restarts=0, name="child")
    inner = child.spawn(procs, "inner", Worker)
    assert parent.children == [steady, child] and child.children == [inner]
    steady_before, inner_before = tokens(steady), tokens(inner)

    inner.slice(gpus=1).boom.broadcast()  # the child may restart nothing: it gives up
    (rec,) = restarted(parent, 1)
    assert rec.child == "child" and "restart intensity exceeded" in rec.reason, rec.reason
    assert child.status == "running" and child.restarts == []
    inner_after = tokens(inner)
    assert all(x != y for x, y in zip(inner_before, inner_after, strict=True))
    assert tokens(steady) == steady_before  # one_for_one: the parent's other child stays


class Boss(Actor):
    """Owns a supervisor inside an actor; records what its ``__supervise__`` hears."""

    def __init__(self) -> None:
        self.heard: list[str] = []

    @endpoint
    def start(self, max_restarts: int) -> None:
        from danaus.actor import this_host

        self.procs = this_host().spawn_procs(per_host={"gpus": 1})
        self.sup = Supervisor(max_restarts=max_restarts, name="inside")
        self.workers = self.sup.spawn(self.procs, "workers", Worker)
        self.workers.initialized.get(timeout=TIMEOUT)

    @endpoint
    def fail_worker(self) -> str:
        before = self.workers.who.call_one().get(timeout=TIMEOUT)[0]
        self.workers.boom.broadcast()
        return before

    @endpoint
    def worker_token(self) -> str:
        return self.workers.who.call_one().get(timeout=TIMEOUT)[0]

    @endpoint
    def restarts(self) -> int:
        return len(self.sup.restarts)

    @endpoint
    def heard_of(self) -> list[str]:
        return list(self.heard)

    def __supervise__(self, failure: Any) -> bool:
        self.heard.append(f"{failure.mesh_name}: {failure.reason}")
        return True


def test_a_supervisor_inside_an_actor_has_that_actor_as_owner(spawn_procs) -> None:
    procs = spawn_procs(gpus=1)
    boss = procs.spawn("boss", Boss)
    boss.start.call_one(1).get(timeout=TIMEOUT)
    first = boss.fail_worker.call_one().get(timeout=TIMEOUT)
    wait_until(lambda: boss.restarts.call_one().get(timeout=TIMEOUT), TIMEOUT, "a restart")
    assert boss.worker_token.call_one().get(timeout=TIMEOUT) != first
    assert boss.heard_of.call_one().get(timeout=TIMEOUT) == []  # the supervisor handled it

    boss.fail_worker.call_one().get(timeout=TIMEOUT)  # one more than max_restarts=1
    heard = wait_until(lambda: boss.heard_of.call_one().get(timeout=TIMEOUT), TIMEOUT, "give-up")
    assert len(heard) == 1 and heard[0].startswith("inside: "), heard
    assert "restart intensity exceeded" in heard[0], heard


def test_bad_arguments_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="strategy must be one of"):
        Supervisor(strategy="one_for_some")
    with pytest.raises(ValueError, match="max_restarts"):
        Supervisor(max_restarts=-1)
    with pytest.raises(ValueError, match="period"):
        Supervisor(period=0)
    with pytest.raises(ValueError, match="cap"):
        Supervisor(backoff=(1.0, 0.5))
    with pytest.raises(TypeError, match="ProcMesh"):
        Supervisor().spawn("not procs", "w", Worker)  # type: ignore[arg-type]


def test_restarts_show_in_the_log_the_dashboard_top_and_traces(spawn_procs, sups, tmp_path) -> None:
    import json
    import logging

    import danaus
    from danaus._cli.observe import plain
    from danaus._observe.state import StateCollector
    from danaus._runtime.node import this_node

    procs = spawn_procs(gpus=1)
    sup = sups(name="watched")
    workers = sup.spawn(procs, "shown", Worker)
    tokens(workers)
    path = tmp_path / "trace.json"
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("danaus.supervision")  # "danaus" does not propagate to root
    logger.addHandler(handler)
    try:
        with danaus.trace(path):
            workers.boom.broadcast()
            restarted(sup, 1)
            tokens(workers)
    finally:
        logger.removeHandler(handler)
    lines = [r.getMessage() for r in records if "restarted" in r.getMessage()]
    assert len(lines) == 1 and "'watched' restarted shown" in lines[0], lines

    state = StateCollector(this_node()).collect()
    (shown,) = [r for r in state["restarts"] if r["supervisor"] == "watched"]
    assert shown["child"] == "shown" and shown["ranks"] == [0] and "boom" in shown["reason"]
    assert "RESTARTED shown[0] by supervisor 'watched'" in plain(state)

    events = json.loads(path.read_text())["traceEvents"]
    (span,) = [e for e in events if e.get("name") == "restart shown"]
    assert span["ph"] == "X" and span["args"]["ranks"] == [0], span
