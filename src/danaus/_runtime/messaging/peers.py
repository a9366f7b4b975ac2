"""The peers of a runtime: procs it waits for, talks to, and has lost.

A part of `Runtime` (``rt.peers``). A peer is *pending*
from ``expect()`` (we spawned it) until its READY; *lost* from ``peer_lost()``
on, for good (proc names are never reused, except the agent/client pair of a
re-attach, which ``forget_peer`` resets). Losing a peer tells, at once,
everything that waits on it: frames queued for it, READY waiters, ports
watching it, the runtime's loss callbacks, and exit waiters.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..._wire.ids import ProcId
from ..._wire.protocol import Message

if TYPE_CHECKING:
    from ..._transport.conn import Connection

__all__ = ["PeerTable"]

log = logging.getLogger("danaus.runtime")


class _Peer:
    """What we know of one proc, and the one connection we share with it.

    ``link`` is that connection once established (we dialled and it
    answered ``WELCOME``, or it dialled and we welcomed it); ``conn`` is the
    same connection once frames may go on it (``link``, published when the
    peer is not pending); ``dialing`` is our own dial still waiting for its
    ``WELCOME``; ``waiting`` a connection the peer dialled while our dial was
    in flight and ours wins (kept, unanswered, in case ours fails).
    """

    __slots__ = (
        "boot_error",
        "conn",
        "dialing",
        "link",
        "lost",
        "pending",
        "proc",
        "queue",
        "queued_bytes",
        "ready_cbs",
        "spawned",
        "stopping",
        "waiting",
    )

    def __init__(self, proc: ProcId, pending: bool) -> None:
        self.proc = proc
        self.conn: Connection | None = None
        self.link: Connection | None = None
        self.dialing: Connection | None = None
        self.waiting: Connection | None = None
        self.pending = pending  # waiting for READY before connecting
        # frames waiting for the connection: (parts, on_fail, on_left: see Connection.send)
        self.queue: list[
            tuple[list[Any], Callable[[str], None] | None, Callable[[], None] | None]
        ] = []
        self.queued_bytes = 0  # the bytes in queue (bounded: senders block above a mark)
        self.lost: str | None = None
        self.stopping = False
        self.spawned = pending  # we spawned it: its host agent will report how it exited
        self.ready_cbs: list[Callable[[str | None], None]] = []
        # What its READY said went wrong at boot, for a ``when_ready`` that comes after it.
        self.boot_error: str | None = None


def _unlist(lists: dict[str, list[Any]], key: str, item: object) -> None:
    """Remove ``item`` from ``lists[key]``, and the key once its list is empty."""
    items = lists.get(key)
    if items is not None and item in items:
        items.remove(item)
        if not items:
            del lists[key]


def _discard(_: object) -> None:
    pass


class PeerTable:
    """The peers of one runtime: what it knows of each proc, and who waits on which.

    A part the runtime builds and hands the callables it needs: ``call_soon``
    (the I/O thread), ``connect`` / ``publish`` / ``adopt`` (the links: dial a
    peer, let queued frames go on its connection, take a connection it
    dialled), ``port`` (a local port's handler, told of losses it watches),
    ``notify_room`` (backpressure: senders held back by a lost peer give up).
    The links and the sender share ``table`` and ``lock`` with it.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        me: Callable[[], ProcId],
        call_soon: Callable[..., None],
        connect: Callable[[_Peer], None],
        publish: Callable[[_Peer], None],
        adopt: Callable[[_Peer, Connection, bool], None],
        port: Callable[[int], Any],
        open_ports: Callable[[], list[tuple[int, Any]]],
        notify_room: Callable[[], None],
    ) -> None:
        self.loop = loop
        self._me = me
        self.call_soon = call_soon
        self._connect = connect
        self._publish = publish
        self._adopt = adopt
        self._port = port
        self._open_ports = open_ports
        self.notify_room = notify_room
        self.table: dict[str, _Peer] = {}  # proc name -> what we know of it
        self.spares: dict[str, Connection] = {}  # welcomed while we held their proc lost
        # Guards the peer table (table and each _Peer's connections, queue and state),
        # _watchers, spares, exited and the exit/loss waiters.
        self.lock = threading.RLock()
        self._watchers: dict[str, set[int]] = {}
        # Called with (name, reason) for every peer lost (other layers add theirs).
        self.lost_callbacks: list[Callable[[str, str], None]] = []
        self.exited: dict[str, str] = {}  # procs the host agent saw exit -> how
        self._exit_waiters: dict[str, list[Callable[[str], None]]] = {}
        self._lost_waiters: dict[str, list[Callable[[str], None]]] = {}

    # -- peers: expected, ready, lost ----------------------------------------

    def expect(self, proc: ProcId, on_ready: Callable[[str | None], None] | None = None) -> None:
        """Declare a proc being spawned for us: frames to it wait for its READY."""
        with self.lock:
            peer = self.table.setdefault(proc.name, _Peer(proc, pending=True))
            if on_ready is not None:
                peer.ready_cbs.append(on_ready)

    def when_ready(self, proc: ProcId, cb: Callable[[str | None], None]) -> None:
        """``cb(None)`` once ``proc`` is up, ``cb(error)`` if its READY reported a boot
        error, or ``cb(reason)`` if it is lost first; at once when that is known already
        (a READY may come before the spawner asks)."""
        with self.lock:
            peer = self.table.get(proc.name)
            if peer is not None and peer.pending and peer.lost is None:
                peer.ready_cbs.append(cb)
                return
            reason = None if peer is None else peer.lost or peer.boot_error
        cb(reason)

    def on_ready(self, conn: Connection, msg: Message) -> None:
        """A READY frame: a proc we expect is up (or failed to boot)."""
        proc, error = msg.header
        with self.lock:
            peer = self.table.setdefault(proc.name, _Peer(proc, pending=True))
            peer.proc = proc  # its real address (a remote proc picks its TCP port at boot)
            cbs, peer.ready_cbs = peer.ready_cbs, []
            peer.pending = False
            peer.boot_error = error
            linked = peer.link is not None and peer.conn is None and peer.lost is None
            start = bool(peer.queue) and peer.lost is None and not linked
        if linked:  # it dialled us already: what waited for its READY goes on that connection
            self._publish(peer)
        elif start:  # even a proc whose bootstrap failed is up: it can still be stopped
            self._connect(peer)
        for cb in cbs:
            cb(error)

    def on_lost_report(self, conn: Connection, msg: Message) -> None:
        """A LOST frame: the host agent saw a proc exit."""
        name, reason = msg.header
        with self.lock:
            self.exited[name] = reason
            waiters = self._exit_waiters.pop(name, [])
        self.peer_lost(name, reason)
        for cb in waiters:
            cb(reason)

    def when_exited(
        self,
        name: str,
        cb: Callable[[str], None],
        grace: float = 1.0,
        agent: str | None = None,
        bound: float | None = None,
    ) -> None:
        """``cb(how)`` once the host agent reports that proc ``name`` exited (we own it).

        The proc's connection closes before its process ends (its exit handlers,
        an exporter's last flush, still run), so a loss alone does not mean it exited.
        If it is lost and no report comes: with ``agent`` (the name of its host agent,
        which reports the exit), ``cb`` runs ``grace`` seconds after the agent is lost
        too, and while the agent lives it waits for the report, at most ``bound``
        seconds from the proc's loss; without ``agent``, ``grace`` seconds after the
        proc's loss. Nothing waits forever.
        """
        done = [False]
        on_agent: list[Callable[[str], None]] = []  # waits on the agent's loss

        def once(how: str) -> None:
            with self.lock:
                if done[0]:
                    return
                done[0] = True
                _unlist(self._exit_waiters, name, once)
                for w in on_agent:  # the agent lives on: it keeps no closure per proc
                    _unlist(self._lost_waiters, agent or "", w)
            cb(how)

        def after_grace(reason: str) -> None:
            _discard(self.loop.call_later(grace, once, reason))

        def after_loss(reason: str) -> None:
            if agent is None:
                after_grace(reason)
                return
            if bound is not None:
                _discard(self.loop.call_later(bound, once, reason))
            with self.lock:
                peer = self.table.get(agent)
                # An agent we never talked to cannot be heard of again: it counts as gone.
                agent_gone = peer is None or peer.lost is not None
                if not agent_gone and not done[0]:
                    on_agent.append(lambda _: after_grace(reason))
                    self._lost_waiters.setdefault(agent, []).append(on_agent[0])
            if agent_gone:
                after_grace(reason)

        with self.lock:
            how = self.exited.get(name)
            lost = self.table[name].lost if name in self.table else None
            if how is None:
                self._exit_waiters.setdefault(name, []).append(once)
                if lost is None:
                    self._lost_waiters.setdefault(name, []).append(after_loss)
        if how is not None:
            once(how)
        elif lost is not None:
            self.call_soon(after_loss, lost)

    def mark_stopping(self, proc: ProcId) -> None:
        with self.lock:
            peer = self.table.setdefault(proc.name, _Peer(proc, pending=False))
            peer.stopping = True

    def forget_peer(self, name: str) -> None:
        """Forget all we know of proc ``name`` (lost included): it came back (re-attach).

        Only for peers whose name is reused on purpose (a worker agent and its
        client across a healed partition); procs never reuse names.
        """
        with self.lock:
            peer = self.table.pop(name, None)
            self.exited.pop(name, None)
            self._watchers.pop(name, None)
            self._lost_waiters.pop(name, None)
            spare = self.spares.pop(name, None)
        if peer is not None:
            for conn in (peer.link, peer.dialing, peer.waiting):
                if conn is not None and not conn.closed and conn is not spare:
                    conn.close()
        if spare is not None and not spare.closed:
            # It dialled us again while we held it lost (that connection was
            # welcomed but left unused): now that it is back, that is our connection.
            fresh = _Peer(spare.peer, pending=False)
            with self.lock:
                self.table[name] = fresh
            self._adopt(fresh, spare, False)  # welcomed when it dialled

    def learn(self, proc: ProcId) -> None:
        """Use ``proc``'s address (a better one than it advertises) from now on."""
        with self.lock:
            peer = self.table.get(proc.name)
            if peer is None:
                self.table[proc.name] = _Peer(proc, pending=False)
            else:
                peer.proc = proc

    def resolve(self, proc: ProcId) -> ProcId:
        """``proc`` with the freshest address known here (procs report theirs when READY)."""
        me = self._me()
        if proc.name == me.name:
            return me
        peer = self.table.get(proc.name)
        return peer.proc if peer is not None else proc

    def is_pending(self, name: str) -> bool:
        """True while proc ``name`` was spawned for us and has not said READY (nor been lost)."""
        peer = self.table.get(name)
        return peer is not None and peer.pending and peer.lost is None

    def spawned_here(self, name: str) -> bool:
        """True if proc ``name`` was spawned for us (its host agent reports its exit to us)."""
        peer = self.table.get(name)
        return peer is not None and peer.spawned

    def is_stopping(self, name: str) -> bool:
        """True once we asked proc ``name`` to stop (its loss is then no failure)."""
        peer = self.table.get(name)
        return peer is not None and peer.stopping

    def unwatch(self, procs: Iterable[str], port: int) -> None:
        """Stop telling ``port`` about the loss of ``procs`` (names)."""
        with self.lock:
            for name in procs:
                ports = self._watchers.get(name)
                if ports is not None:
                    ports.discard(port)
                    if not ports:
                        del self._watchers[name]

    def watch(self, proc: ProcId, port: int) -> str | None:
        """Tell port ``port`` if ``proc`` is lost. Returns the reason if it already is."""
        return self.watch_all((proc,), port).get(proc.name)

    def watch_all(self, procs: Iterable[ProcId], port: int) -> dict[str, str]:
        """`watch` of each of ``procs`` (under one lock); the reasons of those lost already."""
        lost: dict[str, str] = {}
        with self.lock:
            for proc in procs:
                peer = self.table.get(proc.name)
                if peer is None:
                    peer = self.table[proc.name] = _Peer(proc, pending=False)
                if peer.lost is not None:
                    lost[proc.name] = peer.lost
                else:
                    self._watchers.setdefault(proc.name, set()).add(port)
        return lost

    def is_lost(self, name: str) -> str | None:
        peer = self.table.get(name)
        return peer.lost if peer is not None else None

    def peer_lost(self, name: str, reason: str) -> None:
        """Declare proc ``name`` lost (I/O thread): fail everything that waits on it."""
        with self.lock:
            peer = self.table.get(name)
            if peer is None:
                return  # never talked to it: nothing waits on it
            if peer.lost is not None:
                return
            peer.lost = reason
            queued, peer.queue = peer.queue, []
            peer.queued_bytes = 0
            cbs, peer.ready_cbs = peer.ready_cbs, []
            conns = [peer.link, peer.dialing, peer.waiting]
            # What is left of a lost peer is its name and why (senders fail fast on
            # ``lost``): not its connections, whose buffers (the decoder's staging,
            # 128 KiB each) a long run of spawns and stops would otherwise keep.
            peer.conn = peer.link = peer.dialing = peer.waiting = None
            watchers = self._watchers.pop(name, set())
        for conn in conns:
            if conn is not None and not conn.closed:
                conn.close()
        # The ports of calls to one actor of this proc (a handler whose ``lost_with``
        # names it: ``OneCall``) are found now, not registered per call. A port opened
        # after this look sends after the connections closed and ``lost`` was set: its
        # send fails, and that fails it. (Copying the table runs no Python code.)
        watchers |= {p for p, h in self._open_ports() if getattr(h, "lost_with", "") == name}
        self.notify_room()  # senders held back by this peer's backlog give up
        # Every waiter is told, even if telling one of them fails.
        calls: list[Callable[[], Any]] = []
        calls += [left for _, _, left in queued if left is not None]  # never sent
        calls += [functools.partial(f, reason) for _, f, _ in queued if f is not None]
        calls += [functools.partial(cb, reason) for cb in cbs]
        for port in watchers:
            handler = self._port(port)
            if handler is not None:
                calls.append(functools.partial(handler.peer_lost, name, reason))
        calls += [functools.partial(cb, name, reason) for cb in list(self.lost_callbacks)]
        calls += [functools.partial(w, reason) for w in self._lost_waiters.pop(name, [])]
        for call in calls:
            try:
                call()
            except Exception:
                log.exception("danaus internal error while reporting the loss of proc %s", name)
