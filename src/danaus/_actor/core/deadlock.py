"""Deadlock reporting: a call that cycles back into an actor blocked waiting on it.

Each call carries the chain of actors that are (transitively) waiting on it.
An actor blocked in ``Future.get()`` or ``await`` on its serial path that
receives a call whose chain contains itself can never run it: it is waiting on
that very chain, so the call is answered at once with a ``RuntimeError``
naming the cycle. The actor's inbox (``inbox.Inbox``) asks `closes_cycle()`
of each call that arrives or waits while the actor waits, and answers those
that do with `refuse_deadlock()`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..._runtime.messaging.runtime import STATUS_EXC, Runtime
from ..._wire.ids import ActorId
from ..._wire.protocol import Message
from .endpoints import EndpointProperty

__all__ = ["closes_cycle", "refuse_deadlock"]

log = logging.getLogger("danaus.actor")


def closes_cycle(
    actor: ActorId | None, endpoints: Mapping[str, EndpointProperty], frame: Message
) -> bool:
    """Whether call ``frame`` waits (through its chain) on ``actor``, which is blocked:
    it could never run. A concurrent endpoint's body may run meanwhile, so it does not."""
    chain = frame.header.chain
    if not chain or actor is None or actor not in chain:
        return False
    prop = endpoints.get(frame.header.method)
    return prop is None or not prop.concurrent


def refuse_deadlock(rt: Runtime, label: str, frame: Message) -> None:
    """Answer call ``frame`` to actor ``label`` with the deadlock it would close."""
    method, port, index = frame.header.method, frame.header.port, frame.header.slot
    chain = " -> ".join(f"{a.mesh}[{a.rank}]" for a in frame.header.chain)
    err = RuntimeError(
        f"deadlock: actor {label} is blocked waiting on a call that has come back "
        f"to it as {method}() through {chain}; it cannot run this message until that call "
        "returns. Make one side an async @concurrent_endpoint, or do not block on the reply"
    )
    if port is not None:
        rt.reply(port, index, STATUS_EXC, (err, ""))
    else:
        log.error("%s", err)
