"""The coordinator's membership logic, on fake replicas in this process.

``ElasticCoordinator`` decides who trains together: it forms memberships at step
boundaries, drops a replica lost during a step, aborts the others and retries the
step at the smaller size, admits a spare (after it copied a healthy member's state)
and counts what happened. Here its replicas are fakes whose calls answer at once (or
fail with ``SupervisionError``, as a call to a lost actor does), and spawning a
replacement yields a fake spare, so every decision is seen without a process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from danaus._elastic.coordinator import ElasticCoordinator, ElasticStats, _Member, _UserError
from danaus._elastic.replica import ElasticReplica
from danaus._errors import SupervisionError
from danaus._supervision.failure import MeshFailure
from danaus._wire.ids import ProcId


class Call:
    """What ``endpoint.call_one(...)`` returns: awaitable once."""

    def __init__(self, run: Callable[[], Any]) -> None:
        self.run = run

    def __await__(self) -> Any:
        async def go() -> Any:
            await asyncio.sleep(0)  # answered on a later turn of the loop, as a reply is
            return self.run()

        return go().__await__()


class FakeEndpoint:
    def __init__(self, replica: FakeReplica, name: str) -> None:
        self.replica, self.name = replica, name

    def call_one(self, *args: Any) -> Call:
        self.replica.calls.append((self.name, args))
        return Call(lambda: self.replica.answer(self.name, args))


class FakeReplica:
    """Answers the coordinator's calls as a healthy replica does, until it is ``lose()``-d
    (then every call fails with ``SupervisionError``); ``fail_on`` makes one endpoint
    fail with a user exception, ``lose_on`` loses the replica when that endpoint is
    called."""

    def __init__(self, rid: int) -> None:
        self.rid = rid
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.lost = False
        self.lose_on: str | None = None
        self.fail_on: dict[str, BaseException] = {}
        self.state = f"state-of-{rid}"
        self.loaded: Any = None

    def __getattr__(self, name: str) -> FakeEndpoint:
        if not name.startswith("elastic_"):
            raise AttributeError(name)
        return FakeEndpoint(self, name)

    def answer(self, name: str, args: tuple[Any, ...]) -> Any:
        if name == self.lose_on:
            self.lost = True
        if self.lost:
            raise SupervisionError(f"replica {self.rid} is lost")
        if name in self.fail_on:
            raise self.fail_on[name]
        if name == "elastic_join":
            return "ok", None
        if name == "elastic_step":
            _, step, step_args = args
            return "ok", (self.rid, step, *step_args)
        if name == "elastic_state":
            return self.state, [len(self.state)]
        if name == "elastic_load":
            self.loaded = args[0]
            return None
        if name == "elastic_info":
            return 1000 + self.rid, "host"
        return None

    def names(self, endpoint: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.calls if n == endpoint]


class Replica(ElasticReplica):
    pass


class Coordinator(ElasticCoordinator):
    made: list[FakeReplica]
    spawns: asyncio.Event  # spawning waits for it: clear it to hold replacements back


def coordinator(replicas: int, spares: int = 0) -> tuple[Coordinator, list[FakeReplica]]:
    """A coordinator whose spawns make fake replicas (every one made is in the list)."""
    coord = Coordinator(Replica, replicas, spares, (), {}, timeout=30.0)
    made: list[FakeReplica] = []
    coord.made, coord.spawns = made, asyncio.Event()
    coord.spawns.set()

    async def spawn(n: int) -> list[_Member]:
        await coord.spawns.wait()
        out = []
        for _ in range(n):
            fake = FakeReplica(coord.next_id)
            made.append(fake)
            member = _Member(coord.next_id, fake, 1000 + coord.next_id, ("replicas", coord.next_id))
            coord.by_key[member.mesh_key] = member
            coord.next_id += 1
            out.append(member)
        return out

    coord._spawn = spawn  # type: ignore[method-assign]
    return coord, made


async def start(coord: ElasticCoordinator) -> None:
    """What ``start`` does, less the rendezvous store's actor."""
    spawned = await coord._spawn(coord.target + coord.spare_count)
    coord.members, coord.spares = spawned[: coord.target], spawned[coord.target :]
    await coord._boundary()


def joins(fake: FakeReplica) -> list[tuple[int, int, int]]:
    """(epoch, rank, world) of every membership ``fake`` was asked to join."""
    return [(epoch, rank, world) for epoch, rank, world, *_ in fake.names("elastic_join")]


def test_the_first_boundary_forms_membership_zero_with_every_member_in_rank_order() -> None:
    async def main() -> None:
        coord, made = coordinator(3, spares=1)
        await start(coord)
        assert coord.epoch == 0
        assert [joins(f) for f in made[:3]] == [[(0, 0, 3)], [(0, 1, 3)], [(0, 2, 3)]]
        assert made[3].calls == []  # a spare joins nothing until it is admitted
        assert [m.id for m in coord.members] == [0, 1, 2] and [m.id for m in coord.spares] == [3]

    asyncio.run(main())


def test_a_step_runs_on_every_member_then_commits_and_returns_their_values() -> None:
    async def main() -> None:
        coord, made = coordinator(2)
        await start(coord)
        world, values = await coord.step(7, ("batch",))
        assert (world, values) == (2, [(0, 7, "batch"), (1, 7, "batch")])
        for f in made:
            assert [n for n, _ in f.calls] == ["elastic_join", "elastic_step", "elastic_commit"]
            assert f.names("elastic_commit") == [(0, 7)]
        assert coord.stats.steps == 1 and coord.stats.lost == 0 and coord.stats.aborted_steps == 0
        # an unchanged membership is not formed again
        await coord.step(8, ("batch",))
        assert coord.epoch == 0 and all(len(joins(f)) == 1 for f in made)

    asyncio.run(main())


def test_a_member_lost_in_a_step_aborts_the_others_and_the_step_is_retried_smaller() -> None:
    async def main() -> None:
        coord, made = coordinator(3)
        await start(coord)
        coord.spawns.clear()  # the replacement is not up before the retry
        made[1].lose_on = "elastic_step"
        world, values = await coord.step(4, ())
        # the step committed once, at the membership without the lost replica
        assert (world, [v[0] for v in values]) == (2, [0, 2])
        assert [joins(f)[-1] for f in (made[0], made[2])] == [(1, 0, 2), (1, 1, 2)]
        for f in (made[0], made[2]):
            # aborted in membership 0 only; the step computed twice, committed once
            assert [a[0] for a in f.names("elastic_abort")] == [0]
            assert [a[:2] for a in f.names("elastic_step")] == [(0, 4), (1, 4)]
            assert f.names("elastic_commit") == [(1, 4)]
        assert made[1].names("elastic_abort") == [] and made[1].names("elastic_commit") == []
        assert coord.stats.lost == 1 and coord.stats.aborted_steps == 1 and coord.stats.steps == 1
        assert coord.stats.lost_steps == 0  # nothing committed had to be done again
        assert not coord.stats.recovered  # not back to full size yet

    asyncio.run(main())


def test_a_replacement_up_before_the_retry_joins_at_once() -> None:
    async def main() -> None:
        coord, made = coordinator(2)
        await start(coord)
        made[1].lose_on = "elastic_step"
        world, values = await coord.step(1, ())
        # the boundary before the retry admits every ready spare: full size again
        assert (world, [v[0] for v in values]) == (2, [0, 2])
        assert made[2].loaded == made[0].state and coord.stats.recovered

    asyncio.run(main())


def test_a_replacement_copies_a_healthy_members_state_and_joins_at_the_next_boundary() -> None:
    async def main() -> None:
        coord, made = coordinator(2)
        await start(coord)
        coord.spawns.clear()
        made[0].lose_on = "elastic_step"
        assert (await coord.step(1, ()))[0] == 1
        assert made[2:] == [] and len(coord.spawning) == 1  # being spawned
        coord.spawns.set()
        await asyncio.gather(*coord.spawning)
        # the replacement spawned for the lost replica waits as a spare until a boundary
        (replacement,) = made[2:]
        assert [m.id for m in coord.spares] == [replacement.rid] and replacement.calls == []
        assert (await coord.step(2, ()))[0] == 2
        assert replacement.loaded == made[1].state  # the survivor's state, copied over
        assert joins(replacement) == [(2, 1, 2)]
        assert coord.stats.restarts == 1 and coord.stats.recovered
        assert coord.stats.recovery_s is not None and coord.stats.recovery_s >= 0

    asyncio.run(main())


def test_a_member_lost_while_committing_leaves_the_step_committed_by_the_others() -> None:
    async def main() -> None:
        coord, made = coordinator(3)
        await start(coord)
        coord.spawns.clear()
        made[2].lose_on = "elastic_commit"
        world, values = await coord.step(5, ())
        # committed by two; the lost one's gradients went into the step: its value counts
        assert (world, [v[0] for v in values]) == (2, [0, 1, 2])
        assert coord.stats.aborted_steps == 0 and coord.stats.lost == 1
        assert [m.id for m in coord.members] == [0, 1] and coord.dirty

    asyncio.run(main())


def test_a_user_exception_in_a_step_reaches_the_caller_once_every_member_answered() -> None:
    async def main() -> None:
        coord, made = coordinator(2)
        await start(coord)
        made[0].fail_on["elastic_step"] = KeyError("bad batch")
        with pytest.raises(KeyError, match="bad batch"):
            await coord.step(3, ())
        # the other member's step is aborted, nothing committed, nobody dropped
        assert [a[0] for a in made[1].names("elastic_abort")] == [0]
        assert all(f.names("elastic_commit") == [] for f in made)
        assert [m.id for m in coord.members] == [0, 1] and coord.stats.steps == 0

    asyncio.run(main())


def test_gather_returns_values_losses_and_aborts_apart() -> None:
    async def main() -> None:
        coord, made = coordinator(3)
        await start(coord)
        made[1].lost = True
        calls = {
            0: Call(lambda: ("ok", 1)),
            1: made[1].elastic_step.call_one(0, 1, ()),
            2: Call(lambda: ("aborted", "collective failed")),
        }
        values, lost, aborted = await coord._gather(0, calls)
        assert values == {0: ("ok", 1), 2: ("aborted", "collective failed")}
        assert lost == {1} and aborted
        # the others of the epoch were told once; the lost one not at all
        assert [len(f.names("elastic_abort")) for f in made] == [1, 0, 1]

        async def boom() -> Any:
            raise ValueError("user's")

        with pytest.raises(_UserError) as info:
            await coord._gather(0, {0: boom()}, abort_others=False)
        assert isinstance(info.value.__cause__, ValueError)

    asyncio.run(main())


def test_supervise_drops_only_the_members_the_failure_names_and_handles_it() -> None:
    async def main() -> None:
        coord, _ = coordinator(3, spares=1)
        await start(coord)
        failure = MeshFailure("replicas", [1, 3, 99], "killed by SIGKILL")
        assert await coord.__supervise__(failure) is True  # the client never hears
        assert [m.id for m in coord.members] == [0, 2] and coord.spares == []
        assert coord.lost == {1, 3} and coord.stats.lost == 1  # a spare is no member
        assert len(coord.spawning) == 2  # a replacement for each
        # the same failure told twice changes nothing more
        assert await coord.__supervise__(failure) is True
        assert coord.stats.lost == 1 and len(coord.stats.recoveries) == 1
        # a failure of a mesh it does not own is handled and ignored
        assert await coord.__supervise__(MeshFailure("other", [0], "x")) is True
        assert [m.id for m in coord.members] == [0, 2]
        await asyncio.gather(*coord.spawning)
        assert [m.id for m in coord.spares] == [4, 5]

    asyncio.run(main())


def test_losing_every_member_ends_the_mesh_with_an_error_saying_so() -> None:
    async def main() -> None:
        coord, made = coordinator(1)
        await start(coord)
        coord.spawns.clear()  # no replacement comes up
        made[0].lose_on = "elastic_step"
        with pytest.raises(RuntimeError, match="every replica of the elastic mesh was lost"):
            await coord.step(1, ())
        for t in coord.spawning:
            t.cancel()

    asyncio.run(main())


def test_stats_say_whether_every_loss_was_recovered() -> None:
    stats = ElasticStats()
    assert stats.recovered and stats.recovery_s is None
    stats.recoveries = [(10.0, 12.5), (20.0, None)]
    assert not stats.recovered and stats.recovery_s is None
    stats.recoveries[-1] = (20.0, 23.0)
    assert stats.recovered and stats.recovery_s == 3.0


def _on_hosts(coord: Coordinator, members: list[int], spares: list[int]) -> None:
    """Members and spares on those host indices (fake replicas, none lost)."""

    def member(host: int) -> _Member:
        fake = FakeReplica(coord.next_id)
        m = _Member(coord.next_id, fake, 1000 + coord.next_id, ("r", coord.next_id), host)
        coord.by_key[m.mesh_key] = m
        coord.next_id += 1
        return m

    coord.hosts = [object() for _ in range(1 + max(members + spares))]
    coord.members = [member(h) for h in members]
    coord.spares = [member(h) for h in spares]


def test_a_spare_is_admitted_from_the_host_with_the_fewest_members() -> None:
    # Spares that all came up on one host (the others were suspect then) must not
    # make every member live there: losing that host would lose every copy of the state.
    async def main() -> None:
        coord, _ = coordinator(3)
        _on_hosts(coord, members=[0, 1], spares=[1, 0, 2])
        await coord._admit()
        assert sorted(m.host for m in coord.members) == [0, 1, 2]
        assert sorted(m.host for m in coord.spares) == [0, 1]

    asyncio.run(main())


def test_new_replicas_go_to_hosts_without_members_before_less_loaded_ones() -> None:
    coord, _ = coordinator(2)
    _on_hosts(coord, members=[0, 0], spares=[1, 1, 1])
    coord.hosts.append(object())  # host 2: empty
    assert coord._pick_hosts(2) == [2, 1]  # then host 1: spares only, no member
    coord.suspect[2] = time.monotonic()  # lost a member just now: last choice
    assert coord._pick_hosts(1) == [1]


class Peers:
    def __init__(self, lost: set[str]) -> None:
        self.lost = lost

    def is_lost(self, name: str) -> str | None:
        return "gone" if name in self.lost else None

    def forget_peer(self, name: str) -> None:
        self.lost.discard(name)


class FakeHost:
    """A host mesh of one host whose agent is ``agent``, held by a proc with ``peers``."""

    def __init__(self, agent: str, peers: Peers) -> None:
        self.agent, self.peers = ProcId(agent, f"tcp:10.0.0.1:{len(agent)}"), peers

    def _agents(self) -> list[ProcId]:
        return [self.agent]

    def _node(self) -> Any:
        return SimpleNamespace(runtime=SimpleNamespace(peers=self.peers))

    def flatten(self, _: str) -> FakeHost:
        return self

    def __len__(self) -> int:
        return 1

    def slice(self, **_: int) -> FakeHost:
        return self


def test_new_replicas_never_go_to_a_host_whose_worker_is_lost() -> None:
    # Hosts killed earlier stay in the list; spawning there fails at once, and trying
    # them in turn (each then suspect) sent every replacement to the one live host.
    peers = Peers(lost={"w0", "w2"})
    coord, _ = coordinator(2)
    _on_hosts(coord, members=[1], spares=[])
    coord.hosts = [FakeHost(f"w{i}", peers) for i in range(4)]
    assert coord._pick_hosts(2) == [3, 1]


def test_a_host_attached_again_replaces_its_old_entry_and_is_reachable() -> None:
    async def main() -> None:
        peers = Peers(lost={"w1"})  # cut off by a partition, then attached again
        coord, _ = coordinator(2)
        _on_hosts(coord, members=[0, 0], spares=[])
        coord.hosts = [FakeHost("w0", peers), FakeHost("w1", peers)]
        assert await coord.add_hosts(FakeHost("w1", peers)) == 3
        assert peers.lost == set()  # this proc forgot the loss: the worker is back
        assert coord.replaced == {1}
        assert coord._pick_hosts(1) == [2]  # the new entry, not the stale one

    asyncio.run(main())


def test_with_every_worker_lost_a_pick_still_names_a_host_to_try() -> None:
    # Nothing to choose from: the spawn is tried (and fails, and is retried later)
    # rather than the replacement having nowhere to go.
    peers = Peers(lost={"w0", "w1"})
    coord, _ = coordinator(1)
    _on_hosts(coord, members=[0], spares=[])
    coord.hosts = [FakeHost(f"w{i}", peers) for i in range(2)]
    assert coord._pick_hosts(2) == [1, 0]
