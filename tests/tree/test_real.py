"""The cast tree with real procs: values, slices, FIFO per destination, errors, a killed subtree.

13 procs with ``tree_fanout=3`` make this tree (each node keeps its own rank
and forwards the rest of its range)::

    client ─ 0 ─ 1, 2, 3
           ─ 4 ─ 5, 6, 7
           ─ 8 ─ 9, 10, 11 ─ 12
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

import danaus.config
from danaus._actor.core.collect import GatherCollector
from danaus._actor.core.future import resolve
from danaus._mesh.tree import Selection
from danaus._runtime.node import this_node
from danaus.actor import (
    Accumulator,
    Actor,
    ActorError,
    ProcMesh,
    SupervisionError,
    context,
    endpoint,
)
from danaus.testing import FaultRecorder

from .conftest import FANOUT, TIMEOUT


class Log(Actor):
    def __init__(self) -> None:
        self.log: list[Any] = []
        self.lock = threading.Lock()

    @endpoint
    def add(self, *item: Any) -> None:
        with self.lock:
            self.log.append(item)

    @endpoint
    def get_log(self) -> list[Any]:
        return list(self.log)

    @endpoint
    def where(self, x: int = 0) -> tuple[int, dict[str, int], int]:
        rank = context().message_rank
        return rank.rank, dict(rank.extent.items()) if hasattr(rank.extent, "items") else {}, x

    @endpoint
    def boom(self, bad_rank: int) -> int:
        if context().actor_instance.rank.rank == bad_rank:
            raise ValueError(f"rank {bad_rank} refuses")
        return 1

    @endpoint
    def die_at(self, victim: int) -> int:
        rank = context().actor_instance.rank.rank
        self.log.append(("die_at", victim))
        if rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        return rank


class Sender(Actor):
    """A second sender, in a proc of its own, with the same tree settings as the client."""

    def __init__(self) -> None:
        danaus.config.configure(tree_min_ranks=4, tree_fanout=FANOUT)

    @endpoint
    def run(self, mesh: Any, rounds: int) -> None:
        ones = []
        for i in range(rounds):
            mesh.add.broadcast("S-all", i)
            mesh.slice(gpus=slice(1, 13, 2)).add.broadcast("S-odd", i)
            ones.append(mesh.slice(gpus=12).add.call_one("S-one", i))
        for f in ones:
            f.get(timeout=TIMEOUT)


def _stats() -> tuple[int, int]:
    s = this_node().runtime.tree.stats
    return s.forwarded, s.gathers_in


@pytest.fixture(scope="module")
def logs(procs13: ProcMesh) -> Any:
    m = procs13.spawn("logs", Log)
    m.initialized.get(timeout=TIMEOUT)
    return m


def test_call_through_the_tree_reaches_every_rank_and_reads_one_reply_per_subtree(
    logs: Any,
) -> None:
    logs.where.call(0).get(timeout=TIMEOUT)  # the first cast also installs the routes
    sent, gathered = _stats()
    values = logs.where.call(7).get(timeout=TIMEOUT)
    assert [v[0] for v in values.values()] == list(range(13))
    assert {v[2] for v in values.values()} == {7}
    sent2, gathered2 = _stats()
    assert sent2 - sent == FANOUT  # one CAST per subtree of the client, not 13 CALLs
    assert gathered2 - gathered == FANOUT  # one GATHER per subtree, not 13 REPLYs


def test_slices_call_one_stream_and_accumulator_through_the_tree(logs: Any) -> None:
    odd = logs.slice(gpus=slice(1, 13, 2))
    values = odd.where.call().get(timeout=TIMEOUT)
    assert [v[0] for v in values.values()] == list(range(6))  # message ranks in the slice
    # rank 12 is three hops down (client -> 8 -> 11 -> 12)
    assert logs.slice(gpus=12).where.call_one(3).get(timeout=TIMEOUT)[2] == 3
    streamed = sorted(f.get(timeout=TIMEOUT)[0] for f in logs.where.stream())
    assert streamed == list(range(13))
    total = Accumulator(logs.boom, 0, lambda a, b: a + b).accumulate(-1).get(timeout=TIMEOUT)
    assert total == 13
    assert odd.where.choose().get(timeout=TIMEOUT)[0] in range(6)


def test_an_endpoint_error_in_a_gathered_call_is_an_actor_error(logs: Any) -> None:
    with pytest.raises(ActorError, match="rank 12 refuses"):
        logs.boom.call(12).get(timeout=TIMEOUT)
    assert set(logs.boom.call(-1).get(timeout=TIMEOUT).values()) == {1}


def test_fifo_per_sender_and_destination_across_full_casts_slices_and_call_one(
    procs13: ProcMesh, this_proc_mesh: Any = None
) -> None:
    m = procs13.spawn("fifo", Log)
    from danaus.actor import this_host

    other = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        sender = other.spawn("sender", Sender)
        rounds = 30
        remote = sender.run.call_one(m, rounds)  # runs concurrently with the client's casts
        ones = []
        for i in range(rounds):
            m.add.broadcast("C-all", i)
            m.slice(gpus=slice(1, 13, 2)).add.broadcast("C-odd", i)
            ones.append(m.slice(gpus=12).add.call_one("C-one", i))
        for f in ones:
            f.get(timeout=TIMEOUT)
        remote.get(timeout=TIMEOUT)
        logs = m.get_log.call().get(timeout=TIMEOUT)
        for rank, log in enumerate(logs.values()):
            for who in ("C", "S"):
                mine = [e for e in log if e[0].startswith(who)]
                expected = []
                for i in range(rounds):
                    expected.append((f"{who}-all", i))
                    if rank % 2:
                        expected.append((f"{who}-odd", i))
                    if rank == 12:
                        expected.append((f"{who}-one", i))
                assert mine == expected, f"rank {rank}, sender {who}"
    finally:
        other.stop().get(timeout=TIMEOUT)


class Cleanup(Actor):
    """Writes what it handled, and that it was cleaned up, to a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    @endpoint
    def note(self, what: str) -> None:
        with open(f"{self.path}.{context().actor_instance.rank.rank}", "a") as f:
            f.write(what + "\n")

    def __cleanup__(self, exc: Any) -> None:
        with open(f"{self.path}.{context().actor_instance.rank.rank}", "a") as f:
            f.write("cleanup\n")


def test_stop_follows_the_broadcasts_sent_before_it_on_every_path(
    procs13: ProcMesh, tmp_path: Any
) -> None:
    m = procs13.spawn("cleanups", Cleanup, str(tmp_path / "log"))
    m.initialized.get(timeout=TIMEOUT)
    for i in range(5):
        m.note.broadcast(f"b{i}")
    m.slice(gpus=slice(12, 13)).note.broadcast("last")
    m.stop().get(timeout=TIMEOUT)
    for rank in range(13):
        lines = (tmp_path / f"log.{rank}").read_text().split()
        assert lines == [*(f"b{i}" for i in range(5)), *(["last"] if rank == 12 else []), "cleanup"]


def _gather_outcomes(endpoint: Any, *args: Any) -> dict[int, BaseException | Any]:
    """Run ``endpoint.call(*args)`` through the tree and return every rank's own outcome
    (``call()`` itself only shows the first error)."""
    route, method = endpoint._route, endpoint._method
    rt = route.rt
    shape = route.shape
    selection = Selection.of(shape.ndslice)
    out: dict[int, Any] = {}
    done = threading.Event()

    def on_value(slot: int, ok: bool, value: Any) -> None:
        out[slot] = value
        if len(out) == len(shape):
            done.set()

    def on_values(slots: Any, values: Any) -> None:
        for slot, value in zip(slots, values, strict=True):
            on_value(slot, True, value)

    collector = GatherCollector(
        rt, endpoint._what, route.ref.name, len(shape), selection, on_value, on_values
    )
    header = route.headers.cast(method.name, method.flags, True, None, selection, None, ())
    rt.tree.cast(
        route.ref.procs,
        selection,
        header,
        *route.encode(method, args, {}),
        root=collector.root,
    )
    assert done.wait(TIMEOUT), f"only {sorted(out)} answered"
    return {slot: _outcome(value) for slot, value in out.items()}


def _outcome(value: Any) -> Any:
    """A reply's value or exception (replies come undecoded: the reader decodes them)."""
    try:
        return resolve(value)
    except Exception as e:
        return e


def test_a_proc_killed_mid_cast_fails_exactly_its_subtree_and_is_routed_around_after(
    spawn13: Any, faults: FaultRecorder
) -> None:
    m = spawn13().spawn("victims", Log)
    m.initialized.get(timeout=TIMEOUT)
    m.where.call().get(timeout=TIMEOUT)  # routes installed
    # Rank 11 (child of 8, parent of 12) forwards the call to 12, then kills its proc:
    # 12 answers to a proc that is gone, so 11 and 12 fail, and nothing else does.
    outcomes = _gather_outcomes(m.die_at, 11)
    failed = {r for r, v in outcomes.items() if isinstance(v, BaseException)}
    assert failed == {11, 12}
    for r in (11, 12):
        err = outcomes[r]
        assert isinstance(err, SupervisionError)
        assert err.actor == f"victims[{r}]"
        assert "ranks 11..12" in str(err) and "was lost" in str(err)
    assert all(outcomes[r] == r for r in range(11))
    faults.crashed("victims", {11})
    # 12 did run the call: its reply was lost with 11, not its message.
    assert m.slice(gpus=12).get_log.call_one().get(timeout=TIMEOUT) == [("die_at", 11)]
    # Later casts go around the dead proc: 12 is reached through 8 directly.
    below = m.slice(gpus=slice(12, 13)).where.call(5).get(timeout=TIMEOUT)
    assert [v[2] for v in below.values()] == [5]
    healthy = m.slice(gpus=slice(0, 11)).get_log.call().get(timeout=TIMEOUT)
    assert all(log == [("die_at", 11)] for log in healthy.values())
    with pytest.raises(SupervisionError, match=r"victims\[11\]"):
        m.where.call().get(timeout=TIMEOUT)


@pytest.mark.slow  # ~20 s: 64 procs are forked (fewer boot too fast to show the race)
@pytest.mark.timeout(120)
def test_a_call_right_after_spawning_waits_for_every_proc_of_the_tree_to_boot() -> None:
    """The procs of a tree connect to each other: a cast sent while some are still
    being forked must not make a forwarder declare them lost (it has no socket yet)."""
    from danaus.actor import this_host

    danaus.config.configure(tree_fanout=8)  # the client sends to 8 procs, each to 7 more
    pm = this_host().spawn_procs(per_host={"gpus": 64})
    try:
        mesh = pm.spawn("fresh", Log)  # no wait for initialized: call at once
        values = mesh.where.call(5).get(timeout=TIMEOUT)
        assert sorted(r for r, _, _ in values.values()) == list(range(64))
        mesh.add.broadcast("x")
        logs = mesh.get_log.call().get(timeout=TIMEOUT).values()
        assert all(log == [("x",)] for log in logs)
    finally:
        pm.stop().get(timeout=TIMEOUT)
