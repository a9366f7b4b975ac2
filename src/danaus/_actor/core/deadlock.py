"""Deadlock reporting: a call that cycles back into an actor blocked waiting on it.

A mixin of :class:`~danaus._actor.core.cell.ActorCell`. Each call carries the
chain of actors that are (transitively) waiting on it. An actor blocked in
``Future.get()`` or ``await`` on its serial path that receives a call whose
chain contains itself can never run it: it is waiting on that very chain, so
the call is answered at once with a ``RuntimeError`` naming the cycle.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from ..._runtime.messaging.runtime import STATUS_EXC, Runtime
from ..._wire.protocol import Message
from .endpoints import EndpointProperty

if TYPE_CHECKING:
    from .context import Instance

__all__ = ["DeadlockCheck"]

log = logging.getLogger("danaus.actor")


class DeadlockCheck:
    """The deadlock half of an actor cell (mixed into ``ActorCell``)."""

    rt: Runtime
    ctx_instance: Instance | None
    endpoints: dict[str, EndpointProperty]
    waiting: int
    _lock: threading.Lock
    _queued: dict[int, Message]
    _answered: set[int]

    def _label(self) -> str:
        raise NotImplementedError

    def _closes_cycle(self, frame: Message) -> bool:
        chain = frame.header.chain
        if not chain or self.ctx_instance is None or self.ctx_instance.actor_id not in chain:
            return False
        prop = self.endpoints.get(frame.header.method)
        return prop is None or not prop.concurrent  # concurrent bodies may run meanwhile

    def _refuse_deadlock(self, frame: Message) -> None:
        method, port, index = frame.header.method, frame.header.port, frame.header.slot
        chain = " -> ".join(f"{a.mesh}[{a.rank}]" for a in frame.header.chain)
        err = RuntimeError(
            f"deadlock: actor {self._label()} is blocked waiting on a call that has come back "
            f"to it as {method}() through {chain}; it cannot run this message until that call "
            "returns. Make one side an async @concurrent_endpoint, or do not block on the reply"
        )
        if port is not None:
            self.rt.reply(port, index, STATUS_EXC, (err, ""))
        else:
            log.error("%s", err)

    def begin_wait(self) -> None:
        """The actor's thread is about to block on a future: refuse calls that cycle back."""
        with self._lock:
            self.waiting += 1
            cycling = [f for f in self._queued.values() if self._closes_cycle(f)]
            for f in cycling:
                del self._queued[id(f)]
                self._answered.add(id(f))
        for f in cycling:
            self._refuse_deadlock(f)

    def end_wait(self) -> None:
        with self._lock:
            self.waiting -= 1
