"""``ElasticReplica``: one data-parallel replica whose process group follows the membership.

A replica keeps its model and optimizer in memory for the whole run. The
coordinator drives it with four calls per step and membership:

- ``elastic_join(epoch, rank, world, ...)``: build the gloo process group of
  membership ``epoch`` (a fresh key prefix of the coordinator's rendezvous
  store, an actor reached by calls, so no key of an older group is ever read),
  then ``on_membership(membership)``; ``("aborted", why)`` when that
  membership ends before it formed (a member lost meanwhile: the coordinator
  forms the next one at the smaller size);
- ``elastic_step(epoch, step, args)``: the user's ``train_step`` (gradients and
  ``all_reduce``, no update), on a worker thread so that the actor's loop stays
  free for ``elastic_abort``;
- ``elastic_commit(epoch, step)``: the user's ``commit`` (the optimizer step),
  sent only once every member's ``train_step`` succeeded, so the replicas never
  diverge (a rank that finished its ``all_reduce`` while another failed in it
  does not update either);
- ``elastic_abort(epoch)`` (concurrent): wake every collective of that epoch
  with ``MembershipChanged``.

An aborted group is never destroyed: its gloo threads may still wait on the
lost peer until the group's timeout, and destroying it would join them. It is
kept (with every older one) until the actor ends.

No Python runs on gloo's threads, and no thread is left inside torch when the
process ends. A survivor's abandoned collective ends when a peer closes its
connection (``Connection closed by peer``), often as the procs stop together;
a Python callback on its future then ran on gloo's worker thread during the
interpreter's finalization, where taking the GIL ends the thread, and the
process aborted (``terminate called after throwing an instance of
'gloo::IoException'``). So `all_reduce` waits for its work on the step
thread, in slices, looking for an abort between them. Likewise a group build
abandoned in the rendezvous (waiting for a lost member) is made to fail at once
by closing its membership's store on abort and at ``__cleanup__``, and runs on
a non-daemon thread (joined before finalization, never ended inside torch).
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import importlib
import os
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .._actor.api.actor import Actor
from .._actor.api.endpoint import concurrent_endpoint, endpoint
from .._job.spmd import _network_env
from .._rdma.buffer import RDMABuffer
from .._tensor.rendezvous import actor_store

__all__ = ["ElasticReplica", "Membership", "MembershipChanged"]


def _torch_distributed() -> Any:
    """``torch.distributed``, loaded on first use (torch is optional for danaus)."""
    return importlib.import_module("torch.distributed")


class MembershipChanged(RuntimeError):
    """A member was lost (or the coordinator re-formed the group) during a collective.

    Raised by `ElasticReplica.all_reduce()`; let it propagate out of
    ``train_step``: the coordinator retries the step at the new membership.
    """


@dataclass(frozen=True)
class Membership:
    """Who trains together now.

    ``epoch`` counts memberships (0 first, +1 for every change); ``rank`` and
    ``world_size`` are this replica's place in it; ``replica`` is the replica's
    stable id (kept across memberships; replacements get new ones).
    """

    epoch: int
    rank: int
    world_size: int
    replica: int

    def shard(self, n: int) -> range:
        """This member's share of ``n`` items (``range(rank, n, world_size)``): the
        shares of all members cover the ``n`` items once, whatever the size."""
        return range(self.rank, n, self.world_size)


#: Seconds between two looks for an abort while a collective runs (its end is seen at once).
ABORT_POLL_S = 0.01


class _Epoch:
    """One membership on one replica: its process group and whether it was aborted."""

    def __init__(self, membership: Membership) -> None:
        self.membership = membership
        self.pg: Any = None
        self.store: Any = None  # the membership's rendezvous store, closed on abort
        self.aborted = False
        self.why = ""
        self._lock = threading.Lock()
        self._waiters: set[threading.Event] = set()

    def abort(self, why: str) -> None:
        with self._lock:
            self.aborted, self.why = True, why
            waiters = list(self._waiters)
            store = self.store
        for ev in waiters:
            ev.set()
        if store is not None:  # a build still waiting in the rendezvous fails at once
            store.close(f"membership {self.membership.epoch} ended ({self.why})")

    def attach_store(self, store: Any) -> None:
        """Use ``store`` for this membership's build (closed at once if already aborted)."""
        with self._lock:
            self.store = store
            aborted = self.aborted
        if aborted:
            store.close(f"membership {self.membership.epoch} ended ({self.why})")

    def wait_work(self, work: Any, what: str) -> None:
        """Wait for gloo's ``work`` on this thread (not with a callback on its future:
        see the module doc), raising ``MembershipChanged`` on an abort or its failure."""
        poll = datetime.timedelta(seconds=ABORT_POLL_S)
        while not self.aborted:
            try:
                work.wait(poll)
            except RuntimeError as e:
                if not work.is_completed():
                    continue  # this slice ran out ("Operation timed out!")
                # A peer closed its connection, the group timed out.
                raise MembershipChanged(f"{what} failed: {e}") from None
            break
        if self.aborted:
            raise MembershipChanged(
                f"{what}: membership {self.membership.epoch} ended ({self.why})"
            )

    def wait(self, ev: threading.Event, what: str) -> None:
        """Wait for ``ev`` (set when the operation ends) or this epoch's abort."""
        with self._lock:
            if self.aborted:
                raise MembershipChanged(f"{what}: membership {self.membership.epoch} ended")
            self._waiters.add(ev)
        try:
            ev.wait()
        finally:
            with self._lock:
                self._waiters.discard(ev)
        if self.aborted:
            raise MembershipChanged(
                f"{what}: membership {self.membership.epoch} ended ({self.why})"
            )


class _State:
    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="elastic-step")
        self.epoch: _Epoch | None = None
        self.epochs: dict[int, _Epoch] = {}
        self.retired: list[Any] = []  # every process group ever built (see the module doc)
        self.snapshot: tuple[RDMABuffer, Any] | None = None
        self.aborted: dict[int, str] = {}  # epoch -> why, for every abort received


class ElasticReplica(Actor):
    """Base class of one data-parallel replica of an [`ElasticMesh`][danaus.elastic.ElasticMesh].

    Override ``train_step``, ``commit`` and ``state``; optionally
    ``on_membership``. Within ``train_step`` use `membership` (its
    ``shard``) to pick this member's share of the step's batch and
    `all_reduce()` for the gradients. Endpoints added by a subclass must be
    ``async def`` (the replica is an async actor).
    """

    # -- to override ------------------------------------------------------------

    def train_step(self, step: int, *args: Any) -> Any:
        """Compute this member's gradients for ``step`` and ``all_reduce`` them; no update.

        Start from the committed state (zero the gradients first): after a lost
        member the coordinator calls it again for the same step at the new
        membership. Its return value goes back to the caller of ``ElasticMesh.step``.
        """
        raise NotImplementedError(f"{type(self).__qualname__} must define train_step")

    def commit(self, step: int) -> None:
        """Apply the reduced gradients (``optimizer.step()``): called on every member once
        all of them finished ``train_step(step)``."""
        raise NotImplementedError(f"{type(self).__qualname__} must define commit")

    def state(self) -> Sequence[Any]:
        """The tensors a replacement copies from a healthy replica (parameters,
        optimizer buffers): contiguous CPU tensors, the same shapes on every replica."""
        raise NotImplementedError(f"{type(self).__qualname__} must define state")

    def on_membership(self, membership: Membership) -> None:
        """Called on the step thread after each new membership's process group is up."""

    # -- helpers ----------------------------------------------------------------

    @property
    def membership(self) -> Membership:
        """The current membership (``RuntimeError`` before the first one)."""
        return self._elastic_epoch().membership

    @property
    def process_group(self) -> Any:
        """The gloo process group of the current membership, for collectives of your own.
        A collective on it can hang on a lost peer until the group's timeout; prefer
        `all_reduce()`, which the coordinator can abort. Wait for its work with
        ``work.wait()``: a Python callback on the work's future runs on gloo's thread,
        and aborts the process if the work ends while the interpreter finalizes."""
        return self._elastic_epoch().pg

    def all_reduce(self, tensors: Iterable[Any], *, average: bool = False) -> None:
        """Sum ``tensors`` (same dtype) in place across the current members; with
        ``average``, divide by the world size. Raises ``MembershipChanged`` when the
        membership ends meanwhile (a member lost, the step aborted)."""
        import torch

        ep = self._elastic_epoch()
        ts = list(tensors)
        if not ts:
            return
        if len({t.dtype for t in ts}) != 1:
            raise ValueError(f"all_reduce takes tensors of one dtype, got {[t.dtype for t in ts]}")
        flat = torch.cat([t.detach().reshape(-1) for t in ts])
        try:
            work = ep.pg.allreduce([flat])
        except RuntimeError as e:
            raise MembershipChanged(f"all_reduce could not start: {e}") from None
        ep.wait_work(work, "all_reduce")
        if average:
            flat /= ep.membership.world_size
        offset = 0
        with torch.no_grad():
            for t in ts:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view_as(t))
                offset += n

    # -- the coordinator's calls ------------------------------------------------

    def _elastic(self) -> _State:
        st: _State | None = self.__dict__.get("_elastic_state")
        if st is None:
            st = self.__dict__.setdefault("_elastic_state", _State())
        return st

    def _elastic_epoch(self) -> _Epoch:
        ep = self._elastic().epoch
        if ep is None:
            raise RuntimeError("this replica has not joined a membership yet")
        return ep

    async def _on_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(
            self._elastic().executor, functools.partial(fn, *args)
        )

    @endpoint
    async def elastic_info(self) -> tuple[int, str]:
        """This replica's pid and host name."""
        return os.getpid(), os.uname().nodename

    @endpoint
    async def elastic_join(
        self,
        epoch: int,
        rank: int,
        world: int,
        replica: int,
        store: Any,
        timeout: float,
    ) -> tuple[str, Any]:
        """``("ok", None)``, or ``("aborted", why)`` when membership ``epoch`` ended before
        it formed (a member lost meanwhile: the coordinator forms the next one)."""
        st = self._elastic()
        if st.epoch is not None:
            st.epoch.abort(f"membership {epoch} is forming")
        ep = st.epochs.setdefault(epoch, _Epoch(Membership(epoch, rank, world, replica)))
        if epoch in st.aborted:  # its abort came first
            ep.abort(st.aborted[epoch])
        st.epoch = ep
        # A store of its own per membership: the build of an aborted one may still
        # wait in its store (for a key of its lost member) until its timeout.
        member = actor_store(store, timeout)  # here: its calls go out as this replica
        st.retired.append(member)  # torch holds only its C++ side: kept alive with the groups
        ep.attach_store(member)  # an abort (or the actor's end) fails its build at once
        try:
            await self._on_thread(self._join, st, ep, member, timeout)
        except MembershipChanged as e:
            return "aborted", str(e)
        return "ok", None

    def _join(self, st: _State, ep: _Epoch, store: Any, timeout: float) -> None:
        dist = _torch_distributed()
        os.environ.update(_network_env())  # gloo's own connections: the reachable interface
        m = ep.membership
        prefixed = dist.PrefixStore(f"danaus-elastic/{m.epoch}/", store)
        built: dict[str, Any] = {}
        done = threading.Event()

        def build() -> None:  # blocks until every member built its side (or the timeout)
            try:
                built["pg"] = dist.ProcessGroupGloo(
                    prefixed, m.rank, m.world_size, datetime.timedelta(seconds=timeout)
                )
                st.retired.append(built["pg"])
            except Exception as e:
                built["error"] = e
            finally:
                done.set()

        # Not a daemon: the interpreter joins it before finalizing, rather than ending it
        # (pthread_exit) inside torch's C++ when it comes back to Python, which aborts
        # the process. Its store is closed on abort, so it never waits for long.
        threading.Thread(target=build, name=f"elastic-join-{m.epoch}", daemon=False).start()
        ep.wait(done, f"forming membership {m.epoch}")
        if "error" in built:
            raise MembershipChanged(f"forming membership {m.epoch} failed: {built['error']}")
        ep.pg = built["pg"]
        self.on_membership(m)

    @endpoint
    async def elastic_step(self, epoch: int, step: int, args: tuple[Any, ...]) -> tuple[str, Any]:
        """``("ok", train_step's value)`` or ``("aborted", why)``."""
        ep = self._elastic().epoch
        if ep is None or ep.membership.epoch != epoch:
            return "aborted", f"not a member of membership {epoch}"
        try:
            return "ok", await self._on_thread(self.train_step, step, *args)
        except MembershipChanged as e:
            return "aborted", str(e)

    @endpoint
    async def elastic_commit(self, epoch: int, step: int) -> None:
        await self._on_thread(self.commit, step)

    @concurrent_endpoint
    async def elastic_abort(self, epoch: int, why: str) -> None:
        st = self._elastic()
        st.aborted[epoch] = why  # an abort that overtakes its join still ends that epoch
        ep = st.epochs.get(epoch)
        if ep is not None:
            ep.abort(why)

    async def __cleanup__(self, exc: BaseException | None) -> None:
        """End every membership: a group build still waiting in the rendezvous fails at
        once, so that its thread ends before the process does. A subclass that defines
        ``__cleanup__`` calls this one (``await super().__cleanup__(exc)``)."""
        st = self._elastic()
        for ep in list(st.epochs.values()):
            ep.abort("the replica is stopping")

    @endpoint
    async def elastic_state(self) -> tuple[RDMABuffer, list[int]]:
        """A snapshot of ``state()`` as one registered buffer, and each tensor's byte size."""
        snapshot: tuple[RDMABuffer, list[int]] = await self._on_thread(self._snapshot)
        return snapshot

    def _snapshot(self) -> tuple[RDMABuffer, list[int]]:
        import torch

        st = self._elastic()
        if st.snapshot is not None:
            st.snapshot[0].drop()
        parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in self.state()]
        flat = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
        buf = RDMABuffer(flat)
        st.snapshot = (buf, flat)
        return buf, [p.numel() for p in parts]

    @endpoint
    async def elastic_load(self, buf: RDMABuffer, sizes: list[int], timeout: float) -> None:
        """Overwrite ``state()`` with a healthy replica's snapshot, read over the data plane."""
        await self._on_thread(self._load, buf, sizes, timeout)

    def _load(self, buf: RDMABuffer, sizes: list[int], timeout: float) -> None:
        import torch

        state = list(self.state())
        if not all(t.is_contiguous() for t in state):
            raise ValueError("state() must return contiguous tensors (a copy could not be loaded)")
        mine = [t.detach().reshape(-1).view(torch.uint8) for t in state]
        if [t.numel() for t in mine] != list(sizes):
            raise ValueError(
                f"state() differs between replicas: byte sizes {[t.numel() for t in mine]} here, "
                f"{list(sizes)} on the healthy replica"
            )
        flat = torch.empty(sum(sizes), dtype=torch.uint8)
        buf.read_into(flat, timeout=timeout).get(timeout=timeout)
        offset = 0
        with torch.no_grad():
            for t in mine:
                t.copy_(flat[offset : offset + t.numel()])
                offset += t.numel()

    @endpoint
    async def elastic_call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the replica's method ``method`` on its step thread."""
        fn = getattr(self, method, None) if not method.startswith("_") else None
        if fn is None or not callable(fn):
            raise AttributeError(f"{type(self).__qualname__} has no public method {method!r}")
        return await self._on_thread(functools.partial(fn, *args, **kwargs))
