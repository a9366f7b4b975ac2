"""``ElasticCoordinator``: owns the replicas, decides memberships, runs each step to commit.

It lives in a proc of its own and spawns the replicas, so it is their owner:
a replica's failure comes to its ``__supervise__`` (which handles it: the
client never hears of it) and every call to a lost replica fails with
``SupervisionError``. A step:

    boundary   admit ready spares (each copies a healthy member's state over
               RDMABuffer), then, if the members changed, join all of them to
               membership epoch+1 (a new gloo group on a new store prefix)
    step       elastic_step on every member; on a lost member or an aborted
               collective: elastic_abort(epoch) to the others, drop the lost
               ones, retry the same step at the new membership
    commit     elastic_commit on every member once all steps succeeded

The lost replica's share of the batch is redistributed: members take
``membership.shard(n)`` of the same global batch, so a smaller membership
computes the same mean gradient. A replacement is spawned for every lost
replica; it waits as a spare until the next boundary.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .._actor.api.actor import Actor
from .._actor.api.endpoint import concurrent_endpoint
from .._actor.api.hosts import this_host
from .._actor.api.procs import this_proc
from .._errors import SupervisionError
from .._runtime.logs.dirs import NOTIFY
from .._tensor.rendezvous import RendezvousStore

__all__ = ["ElasticCoordinator", "ElasticStats"]

log = logging.getLogger("danaus.elastic")

#: Seconds before trying again to spawn a replacement that failed: first, at most.
REPLACE_BACKOFF = (0.5, 30.0)
#: Seconds for which a host that lost a member is the last choice for new replicas.
SUSPECT_S = 60.0


@dataclass
class ElasticStats:
    """What happened to an elastic mesh so far.

    ``steps``: steps committed; ``lost``: replicas lost; ``restarts``:
    replacements that joined; ``aborted_steps``: step attempts abandoned because
    the membership changed (each retried at once, from the same state);
    ``lost_steps``: committed steps that had to be done again (none: state is
    never rolled back); ``recoveries``: one ``(lost_at, full_at)`` per lost
    member, wall-clock times (``time.time()``) of the coordinator seeing the loss
    and of the next step committed at full size (``None`` while not back to full
    size); ``spares``: replicas ready to take a lost one's place now.
    """

    steps: int = 0
    lost: int = 0
    restarts: int = 0
    aborted_steps: int = 0
    lost_steps: int = 0
    recoveries: list[tuple[float, float | None]] = field(default_factory=list)
    spares: int = 0

    @property
    def recovered(self) -> bool:
        """True when every loss so far was followed by a step at full size."""
        return all(full_at is not None for _, full_at in self.recoveries)

    @property
    def recovery_s(self) -> float | None:
        """Seconds from the last loss to full size again (None: no loss, or not back to
        full size since it)."""
        if not self.recoveries:
            return None
        lost_at, full_at = self.recoveries[-1]
        return None if full_at is None else full_at - lost_at


def _one_per_host(hosts: Any) -> list[Any]:
    flat = hosts.flatten("elastic_hosts")
    return [flat.slice(elastic_hosts=i) for i in range(len(flat))]


def _agent_names(host: Any) -> set[str]:
    """The names of the host agents of host mesh ``host`` (none while unknown)."""
    try:
        return {a.name for a in host._agents() if a is not None}
    except (AttributeError, TimeoutError):  # not attached yet, or not a host mesh
        return set()


def _peers(host: Any) -> Any:
    """The peer table of the proc that holds host mesh ``host`` (None if unknown)."""
    try:
        return host._node().runtime.peers
    except AttributeError:
        return None


def _lost_here(host: Any) -> bool:
    """Whether this proc holds ``host``'s agent lost: a spawn there fails at once, for
    good (a host back from a partition or restarted comes back by ``add_hosts``)."""
    peers = _peers(host)
    return peers is not None and any(peers.is_lost(n) for n in _agent_names(host))


def pick_hosts(
    n: int, hosts: int, live: list[int], suspect: set[int], members: list[Any], spares: list[Any]
) -> list[int]:
    """Host indices (of ``hosts``) for ``n`` new replicas: only ``live`` ones, those whose
    worker is not lost (killed, or cut off and attached again under a new index: a
    spawn there fails, and trying each in turn once left every new replica on the one
    host that was not suspect), unless none is; ``suspect`` ones (a member lost there
    lately: they may be gone or cut off) last; then those with the fewest members (a
    spare there spreads the members once admitted), then the least loaded."""
    on = collections.Counter(m.host for m in members)
    load = collections.Counter(m.host for m in [*members, *spares])
    picks: list[int] = []
    for _ in range(n):
        h = min(live or range(hosts), key=lambda i: (i in suspect, on[i], load[i], i))
        on[h] += 1  # each new one may be admitted: counted as a member
        load[h] += 1
        picks.append(h)
    return picks


@dataclass
class _Member:
    id: int
    actor: Any  # an ActorMesh of one ElasticReplica
    pid: int
    mesh_key: tuple[str, int]  # (actor mesh name, rank in it): how failures name it
    host: int = 0  # index of its host in the coordinator's hosts (0: its own host)


class _UserError(Exception):
    pass


class ElasticCoordinator(Actor):
    def __init__(
        self,
        replica: type,
        replicas: int,
        spares: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float,
        hosts: Any = None,
    ) -> None:
        self.cls, self.target, self.spare_count = replica, replicas, spares
        # Where replicas go: one host mesh per host (None: this proc's host).
        self.hosts: list[Any] | None = None if hosts is None else _one_per_host(hosts)
        self.suspect: dict[int, float] = {}  # host index -> when a member there was lost
        self.replaced: set[int] = set()  # host indices attached again under a new index
        self.args, self.kwargs, self.timeout = args, kwargs, timeout
        self.members: list[_Member] = []
        self.spares: list[_Member] = []
        self.by_key: dict[tuple[str, int], _Member] = {}
        self.lost: set[int] = set()
        self.next_id = 0
        self.epoch = -1
        self.dirty = True  # the members changed since the last membership was formed
        self.store: Any = None  # the RendezvousStore the memberships' groups meet through
        self.stats = ElasticStats()
        self.committed: collections.Counter[int] = collections.Counter()
        self.spawning: set[asyncio.Task[None]] = set()
        self.procs: list[Any] = []
        self.generation = 0

    # -- spawning ---------------------------------------------------------------

    def _pick_hosts(self, n: int) -> list[int]:
        """Host indices for ``n`` new replicas (``pick_hosts``)."""
        if self.hosts is None:
            return [0] * n
        now = time.monotonic()
        suspect = {h for h, t in self.suspect.items() if now - t < SUSPECT_S}
        live = [
            i for i in range(len(self.hosts))
            if i not in self.replaced and not _lost_here(self.hosts[i])
        ]  # fmt: skip
        return pick_hosts(n, len(self.hosts), live, suspect, self.members, self.spares)

    async def _spawn(self, n: int) -> list[_Member]:
        picks = self._pick_hosts(n)
        groups: dict[int, list[_Member]] = {}
        spawned: list[Any] = []
        counts = collections.Counter(picks)
        # Every host at once: one host's procs starting (importing the replica's
        # modules) need not wait for another's.
        results = await asyncio.gather(
            *(self._spawn_on(h, count, spawned) for h, count in counts.items()),
            return_exceptions=True,
        )
        for h, got in zip(counts, results, strict=True):
            if not isinstance(got, BaseException):
                groups[h] = got
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:  # nothing of a failed spawn is left behind
            for members in groups.values():
                for m in members:
                    self.by_key.pop(m.mesh_key, None)
            for procs in spawned:
                await self._stop_failed(procs)
            raise failed[0]
        # In the order picked: the first ``target`` are members, spread over the hosts.
        return [groups[h].pop(0) for h in picks]

    async def _stop_failed(self, procs: Any) -> None:
        """Stop the procs of a failed spawn (bounded); if they do not stop, they stay in
        ``self.procs`` and shutdown stops them again."""
        try:
            await asyncio.wait_for(procs.stop(), self.timeout)
            self.procs.remove(procs)
        except BaseException as e:
            log.warning("stopping the procs of a failed spawn: %r", e)

    async def _spawn_on(self, h: int, n: int, spawned: list[Any]) -> list[_Member]:
        self.generation += 1
        name = f"replicas{self.generation}"
        on = this_host() if self.hosts is None else self.hosts[h]
        try:
            procs = on.spawn_procs(per_host={"procs": n})  # raises at once for a lost host
        except BaseException:
            if self.hosts is not None:
                self.suspect[h] = time.monotonic()  # try another host first next time
            raise
        self.procs.append(procs)
        try:
            mesh: Any = procs.spawn(name, self.cls, *self.args, **self.kwargs)
            # Bounded: a spawn that never ends must not keep a replacement from being
            # tried again (the client waits as long for the first replicas).
            await asyncio.wait_for(mesh.initialized, 4 * self.timeout)
            infos = [
                await asyncio.wait_for(mesh.slice(procs=i).elastic_info.call_one(), self.timeout)
                for i in range(n)
            ]
        except BaseException:  # nothing of a failed spawn is left behind
            if self.hosts is not None:
                self.suspect[h] = time.monotonic()  # try another host first next time
            await self._stop_failed(procs)
            raise
        spawned.append(procs)
        out = []
        for i, (pid, _) in enumerate(infos):
            member = _Member(self.next_id, mesh.slice(procs=i), pid, (name, i), h)
            self.next_id += 1
            self.by_key[member.mesh_key] = member
            out.append(member)
        return out

    @concurrent_endpoint
    async def add_hosts(self, hosts: Any) -> int:
        """Take ``hosts`` (a ``HostMesh``) for replacements and spares from now on; how
        many hosts the mesh may use."""
        if self.hosts is None:
            self.hosts = [this_host()]
        for host in _one_per_host(hosts):
            names = _agent_names(host)
            # The same worker attached again (back from a partition): only the new mesh
            # is used, and its agent, held lost here, is reachable again.
            self.replaced |= {i for i, h in enumerate(self.hosts) if names & _agent_names(h)}
            peers = _peers(host)
            for name in names:
                if peers is not None and peers.is_lost(name):
                    peers.forget_peer(name)
            self.hosts.append(host)
        return len(self.hosts)

    async def _replace(self) -> None:
        """Spawn one spare, trying again (with backoff) until one is up: a spawn that
        failed (no room on the host yet, an ``__init__`` that raised) must not leave
        the mesh short of a spare for good. Cancelled by ``shutdown``."""
        delay = REPLACE_BACKOFF[0]
        while True:
            try:
                # Spawned first, then added: ``self.spares.extend(await ...)`` would
                # take the list before the await, and a loss meanwhile (``_lose``
                # makes a new list) left the new spare in the old one, lost for good.
                spawned = await self._spawn(1)
                self.spares.extend(spawned)
                return
            except Exception as e:  # the members keep training meanwhile
                log.warning(
                    "spawning a replacement replica failed (%s); trying again in %.1f s",
                    e, delay,
                )  # fmt: skip
            await asyncio.sleep(delay)
            delay = min(REPLACE_BACKOFF[1], 2 * delay)

    def _lose(self, ids: set[int], why: str) -> None:
        """Drop members and spares ``ids``; start a replacement for each lost member."""
        fresh = ids - self.lost
        if not fresh:
            return
        self.lost |= fresh
        lost_members = [m for m in self.members if m.id in fresh]
        self.members = [m for m in self.members if m.id not in fresh]
        self.spares = [m for m in self.spares if m.id not in fresh]
        for m in lost_members:
            self.suspect[m.host] = time.monotonic()
        if lost_members:
            self.dirty = True
            self.stats.lost += len(lost_members)
            now = time.time()
            self.stats.recoveries.extend((now, None) for _ in lost_members)
            log.warning(  # the user's terminal too (forwarded from this proc): news for them
                "lost replicas %s (%s)", sorted(m.id for m in lost_members), why,
                extra={NOTIFY: True},
            )  # fmt: skip
        for _ in fresh:
            task = asyncio.get_running_loop().create_task(self._replace())
            self.spawning.add(task)
            task.add_done_callback(self.spawning.discard)

    async def __supervise__(self, failure: Any) -> bool:
        ids = {
            m.id
            for r in failure.crashed_ranks
            if (m := self.by_key.get((failure.mesh_name, r))) is not None
        }
        if ids:
            self._lose(ids, failure.reason)
        return True  # handled: a lost replica is this mesh's business, not the client's

    # -- calls to many members --------------------------------------------------

    async def _gather(
        self, epoch: int, calls: dict[int, Any], abort_others: bool = True
    ) -> tuple[dict[int, Any], set[int], bool]:
        """Await ``calls`` (member id -> Future). Returns (values, lost ids, aborted).

        On the first lost member or ``("aborted", why)`` value, the others of
        ``epoch`` are aborted (so none waits on a dead peer). A user exception is
        re-raised (as ``_UserError``) once every call has ended.
        """

        async def wait(f: Any) -> Any:
            return await f

        tasks = {asyncio.ensure_future(wait(f)): i for i, f in calls.items()}
        values: dict[int, Any] = {}
        lost: set[int] = set()
        aborted = False
        error: BaseException | None = None
        sent_abort = False
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(
                pending, timeout=self.timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                for t in pending:
                    t.cancel()
                raise TimeoutError(f"replicas {sorted(tasks[t] for t in pending)} did not answer")
            for t in done:
                i = tasks[t]
                exc = t.exception()
                if isinstance(exc, SupervisionError) or (exc is not None and i in self.lost):
                    lost.add(i)
                elif exc is not None:
                    error = error or exc
                else:
                    values[i] = t.result()
                    if isinstance(values[i], tuple) and values[i][:1] == ("aborted",):
                        aborted = True
            if (lost or aborted or error) and abort_others and not sent_abort:
                sent_abort = True
                why = f"replicas {sorted(lost)} lost" if lost else "a collective failed"
                self._abort(epoch, why, skip=lost)
        if error is not None:
            raise _UserError() from error
        return values, lost, aborted

    def _abort(self, epoch: int, why: str, skip: set[int]) -> None:
        for m in self.members:
            if m.id not in skip and m.id not in self.lost:
                # Its answer does not matter (a lost replica's call fails: ignored).
                m.actor.elastic_abort.call_one(epoch, why)

    # -- boundaries -------------------------------------------------------------

    async def _admit(self) -> None:
        """Bring ready spares in, each with the state of a healthy member."""
        while len(self.members) < self.target and self.spares and self.members:
            # The spare on the host with the fewest members: the members spread over
            # the hosts, so that losing one host does not lose every copy of the state.
            on = collections.Counter(m.host for m in self.members)
            spare = min(self.spares, key=lambda m: on[m.host])
            source = self.members[0]
            try:
                buf, sizes = await source.actor.elastic_state.call_one()
                await spare.actor.elastic_load.call_one(buf, sizes, self.timeout)
            except Exception as e:
                # The source lost while the spare read its snapshot fails the spare's
                # read (an ActorError), not a call to the source: ask who is gone.
                gone = await self._which_lost([spare, source])
                if not gone:
                    raise _UserError() from e  # both alive: the copy itself failed
                self._lose(gone, "lost while copying state")
                continue
            if spare not in self.spares:  # lost meanwhile (``_lose`` made a new list)
                continue
            self.spares.remove(spare)
            self.members.append(spare)
            self.stats.restarts += 1
            self.dirty = True

    async def _which_lost(self, members: list[_Member]) -> set[int]:
        """The ids of ``members`` that are lost (a call to each settles it)."""

        async def gone(m: _Member) -> bool:
            if m.id in self.lost:
                return True
            try:
                await asyncio.wait_for(m.actor.elastic_info.call_one(), self.timeout)
            except SupervisionError:
                return True
            except TimeoutError:
                return True  # alive but not answering: no use as a member
            return False

        found = await asyncio.gather(*(gone(m) for m in members))
        return {m.id for m, g in zip(members, found, strict=True) if g}

    async def _boundary(self) -> None:
        while True:
            await self._admit()
            if not self.members:
                raise RuntimeError("every replica of the elastic mesh was lost")
            if not self.dirty:
                return
            self.epoch += 1
            self.dirty = False
            world = len(self.members)
            calls = {
                m.id: m.actor.elastic_join.call_one(
                    self.epoch, rank, world, m.id, self.store, self.timeout
                )
                for rank, m in enumerate(self.members)
            }
            # A member lost while the group forms (its join fails; the others' joins
            # answer "aborted"): form the next membership without it, at once.
            _, lost, aborted = await self._gather(self.epoch, calls)
            if lost:
                self._lose(lost, "lost while forming a membership")
            if lost or aborted:
                self.dirty = True

    # -- endpoints --------------------------------------------------------------

    @concurrent_endpoint
    async def start(self) -> list[int]:
        """Spawn the replicas and spares, form the first membership; the members' pids."""
        # An actor of this proc, reached by the replicas' calls only: no port a stranger
        # could list, set or block keys through (issue 40, N1).
        self.store = this_proc().spawn("elastic_store", RendezvousStore)
        await self.store.initialized
        spawned = await self._spawn(self.target + self.spare_count)
        self.members, self.spares = spawned[: self.target], spawned[self.target :]
        try:
            await self._boundary()
        except _UserError as e:
            raise e.__cause__ from None  # type: ignore[misc]
        return [m.pid for m in self.members]

    @concurrent_endpoint
    async def step(self, step: int, args: tuple[Any, ...]) -> tuple[int, list[Any]]:
        """Run ``step`` to commit on the current members: (how many committed it, the
        ``train_step`` values of the members that computed it, in rank order)."""
        try:
            return await self._step(step, args)
        except _UserError as e:  # the user's exception, as raised in the replica
            raise e.__cause__ from None  # type: ignore[misc]

    async def _step(self, step: int, args: tuple[Any, ...]) -> tuple[int, list[Any]]:
        while True:
            await self._boundary()
            epoch, members = self.epoch, list(self.members)
            calls = {m.id: m.actor.elastic_step.call_one(epoch, step, args) for m in members}
            values, lost, aborted = await self._gather(epoch, calls)
            if lost:
                self._lose(lost, f"lost during step {step}")
            if lost or aborted:
                self.stats.aborted_steps += 1
                self.dirty = True
                continue
            commits = {m.id: m.actor.elastic_commit.call_one(epoch, step) for m in members}
            _, lost, _ = await self._gather(epoch, commits, abort_others=False)
            if lost:  # the others committed: the step is done, at the smaller size
                self._lose(lost, f"lost while committing step {step}")
            self.committed[step] += 1
            self.stats.steps += 1
            self.stats.lost_steps = sum(n - 1 for n in self.committed.values())
            world = len(self.members)
            if world == self.target and not lost:
                now = time.time()
                rec = self.stats.recoveries
                rec[:] = [(t, now if full is None else full) for t, full in rec]
            # The world of the step: the members that committed it; the values: of every
            # member whose gradients went into it (one lost while committing included).
            return len(members) - len(lost), [values[m.id][1] for m in members]

    @concurrent_endpoint
    async def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """``method`` on every current member, in rank order."""
        try:
            await self._boundary()
        except _UserError as e:
            raise e.__cause__ from None  # type: ignore[misc]
        return list(
            await asyncio.gather(
                *(m.actor.elastic_call.call_one(method, args, kwargs) for m in self.members)
            )
        )

    @concurrent_endpoint
    async def get_stats(self) -> ElasticStats:
        self.stats.spares = len(self.spares)
        return self.stats

    @concurrent_endpoint
    async def members_info(self) -> list[tuple[int, int]]:
        """(replica id, pid) of each current member, in rank order."""
        return [(m.id, m.pid) for m in self.members]

    @concurrent_endpoint
    async def shutdown(self) -> None:
        for t in list(self.spawning):
            t.cancel()
        for procs in list(self.procs):  # a cancelled spawn removes its own meanwhile
            try:
                await procs.stop()
            except Exception as e:  # a proc already lost
                log.debug("stopping replicas: %s", e)
