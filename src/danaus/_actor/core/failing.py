"""How an actor fails, and what it tells its callers and its owner when it does.

`Fate` is a part of `ActorCell`. An
actor fails on an exception with no one to tell (a broadcast), a ``BaseException``, a failed
``__init__``, ``abort()``, an explicit-port endpoint that raises, a declined or
raising ``__supervise__``, an undeliverable message it does not handle, or an
internal error; from then on every call gets ``SupervisionError``, the owner
gets a ``FAILED`` report, and the meshes it owns are stopped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import traceback
from typing import Any, Protocol

from ..._errors import RemoteException, SupervisionError
from ..._runtime.messaging.runtime import STATUS_ERROR, STATUS_EXC, STATUS_OK, Runtime
from ..._runtime.node import Node
from ..._wire import codec
from ..._wire.ids import ActorId, PortId
from ..._wire.protocol import Failed, Message
from . import owned
from .endpoints import EndpointProperty
from .frames import user_traceback
from .inbox import Bounced, Item, Stop, Supervise


class Envelope(Protocol):
    """A message that came back undeliverable (``ports.Undeliverable``), as a failure
    report names it."""

    def dest(self) -> str: ...

    def error_msg(self) -> str: ...


class Named(Protocol):
    """The actor's ``Instance`` (``context.py``), as a failure names it: printed in the
    errors its callers get, and the owner of the meshes stopped with it."""

    @property
    def actor_id(self) -> ActorId: ...

    def _home(self) -> Node: ...


__all__ = ["Aborted", "Fate", "exception_payload", "refuse_stopped", "reply_stopped"]

log = logging.getLogger("danaus.actor")


class Aborted(BaseException):
    """Raised inside an actor by ``context().actor_instance.abort()`` to fail it."""

    def __init__(self, reason: str | None) -> None:
        super().__init__(reason)
        self.reason = reason if reason is not None else "no reason provided"


def exception_payload(e: BaseException) -> tuple[BaseException, str]:
    """``(exception, remote traceback text)``, with the exception made picklable if needed.

    The frames of danaus's own dispatch code are left out of the traceback
    (`user_traceback()`).
    """
    tb = "".join(traceback.format_exception(type(e), e, user_traceback(e.__traceback__)))
    try:
        codec.dumps(e)
        exc: BaseException = e
    except Exception:
        exc = RemoteException(f"{type(e).__module__}.{type(e).__qualname__}", str(e))
    return exc, tb


class Fate:
    """Whether an actor failed and why, and telling its callers and its owner.

    One per actor cell. Any thread may fail the actor (`fail()`); the first
    reason wins. ``instance`` is the actor's ``Instance`` once it has one (its
    name in the errors callers get, and the owner of the meshes stopped with it).
    """

    def __init__(self, rt: Runtime, mesh_id: str, rank: int, owner: ActorId | None) -> None:
        self.rt = rt
        self.mesh_id = mesh_id
        self.rank = rank
        self.owner = owner
        self.label = f"{mesh_id}[{rank}]"
        self.instance: Named | None = None
        self.failed: str | None = None
        self.fail_exc: BaseException | None = None  # what __cleanup__ gets after a failure
        self.owned_stopping: threading.Thread | None = None  # stopping the meshes it owned
        self._lock = threading.Lock()  # guards failed and fail_exc

    def init_failed(self, e: BaseException, what: str, init_port: PortId) -> None:
        """Its construction raised ``e``: the spawner hears, and the actor fails."""
        exc, tb = exception_payload(e)
        self.rt.reply(init_port, self.rank, STATUS_EXC, (exc, tb))
        self.fail(f"actor {self.label} failed during spawn: {what}: {type(e).__name__}: {e}", tb)

    def internal_error(self, frame: Message, e: BaseException) -> None:
        """danaus itself failed while handling ``frame``: fail the actor and answer the call."""
        _, tb = exception_payload(e)
        reason = (
            f"actor {self.label} failed: danaus hit an internal error while handling a "
            f"message ({type(e).__name__}: {e}); this is a bug in danaus, please report it"
        )
        self.fail(reason, tb)
        try:
            self.reply_error(frame.header.port, frame.header.slot, reason)
        except Exception:
            log.exception("could not answer a call after an internal error")

    def raised(
        self,
        e: BaseException,
        prop: EndpointProperty,
        port: PortId | None,
        index: int,
        stopping: bool,
    ) -> None:
        """Endpoint ``prop``'s body raised ``e`` (``stopping``: the actor's stop has begun)."""
        if isinstance(e, asyncio.CancelledError) and stopping:
            # A concurrent endpoint cancelled because the actor is stopping: not a
            # failure, but its caller (if any) must hear, or it would wait forever.
            self.reply_stopped(port, index)
            return
        if prop.explicit_response_port and isinstance(e, Exception):
            reason = (
                f"actor {self.label} failed: {prop.name}() raised {type(e).__name__}: {e} "
                "instead of answering through its response port"
            )
            self.fail(reason, exception_payload(e)[1], e)
            self.reply_error(port, index, reason)
            return
        if port is not None and isinstance(e, Exception):
            self.reply_exc(port, index, e)
            return
        # No one to tell (broadcast), or a BaseException: the actor fails.
        _, tb = exception_payload(e)
        if isinstance(e, Aborted):
            reason = f"actor {self.label} aborted: {e.reason}"
            tb = ""
        elif port is None:
            reason = (
                f"actor {self.label} failed: {prop.name}() raised {type(e).__name__}: {e} "
                "in a message with no reply (broadcast)"
            )
        else:
            reason = f"actor {self.label} failed: {prop.name}() raised {type(e).__name__}: {e}"
        self.fail(reason, tb, e)
        if port is not None:
            self.reply_error(port, index, reason)

    def bounced(self, env: Envelope, handled: bool, error: BaseException | None) -> None:
        """``_handle_undeliverable_message(env)`` ran: ``handled`` it, or raised ``error``."""
        if handled or self.failed is not None:
            return
        if error is not None:
            _, tb = exception_payload(error)
            reason = (
                f"actor {self.label} failed: _handle_undeliverable_message raised "
                f"{type(error).__name__}: {error}"
            )
        else:
            tb = ""
            reason = (
                f"actor {self.label} failed: a message it sent to {env.dest()} could not be "
                f"delivered ({env.error_msg()}) and it did not handle it"
            )
        self.fail(reason, tb)

    def supervised(
        self, failure: object, handled: bool, error: BaseException | None, has_hook: bool
    ) -> None:
        """``__supervise__(failure)`` ran (``has_hook``: the actor has one): ``handled``
        it, or raised ``error``."""
        if handled or self.failed is not None:
            return
        if error is not None:
            _, tb = exception_payload(error)
            reason = (
                f"actor {self.label} failed: __supervise__ raised {type(error).__name__}: "
                f"{error} while handling {failure}"
            )
        else:
            how = "declined" if has_hook else "has no __supervise__ for"
            reason = f"actor {self.label} failed: it {how} {failure}"
            tb = getattr(failure, "traceback", "") or ""
        # As Monarch's, the report names the actor the failure started at (nested).
        self.fail(reason, tb, origin=getattr(failure, "actor", "") or "")

    def fail(
        self, reason: str, tb: str, exc: BaseException | None = None, origin: str = ""
    ) -> None:
        """Fail this actor (any thread): later calls get ``SupervisionError``; the owner hears.

        The meshes it owns are stopped: no one is left to supervise them. Its
        ``__cleanup__`` then gets ``exc`` (or an ``Exception`` of ``reason``), as
        in Monarch, on the actor's thread once the failing message is done.
        ``origin`` names the actor the failure started at, when it came up unhandled
        from a mesh this one spawned.
        """
        with self._lock:
            if self.failed is not None:
                return
            self.failed = reason
            self.fail_exc = exc if exc is not None else Exception(reason)
        self.report_failure(reason, tb, origin)
        if self.instance is not None:
            stopping = threading.Thread(
                target=owned.stop_owned,
                args=(self.instance._home(), self.instance.actor_id, f"its owner failed: {reason}"),
                daemon=True,
            )
            self.owned_stopping = stopping
            stopping.start()

    def report_failure(self, reason: str, tb: str, origin: str = "") -> None:
        """Tell the owner of this actor's mesh that it failed (supervision handles it there)."""
        log.error("%s\n%s", reason, tb)
        if self.owner is not None:
            self.rt.send(
                self.owner.proc,
                Failed(self.owner, self.mesh_id, self.rank, reason, tb, origin),
                on_fail=lambda why: log.error("could not report a failure to the owner: %s", why),
            )

    def owned_stopped(self, timeout: float) -> None:
        """After a failure: wait until the meshes it owned have stopped (bounded)."""
        stopping = self.owned_stopping
        if stopping is not None:
            stopping.join(timeout)

    def refuse(self, item: Item) -> None:
        """Answer an inbox item that arrived after the actor stopped."""
        if type(item) is Message:
            refuse_stopped(self.rt, self.label, item.header)
        elif isinstance(item, Supervise):
            log.error("actor %s stopped before it could supervise: %s", self.label, item.failure)
        elif isinstance(item, Bounced):
            log.warning(
                "actor %s had stopped when a message it sent came back: %s",
                self.label,
                item.envelope,
            )
        elif isinstance(item, Stop) and item.port is not None:
            self.rt.reply(item.port, item.slot, STATUS_OK, None)

    def reply_exc(self, port: PortId | None, index: int, e: BaseException) -> None:
        if port is not None:
            self.rt.reply(port, index, STATUS_EXC, exception_payload(e))

    def reply_stopped(self, port: PortId | None, index: int) -> None:
        reply_stopped(self.rt, self.label, port, index)

    def reply_error(self, port: PortId | None, index: int, reason: str) -> None:
        if port is not None:
            who = str(self.instance) if self.instance is not None else self.label
            err = SupervisionError(  # Monarch's sentence first: programs match on it
                f"The actor {who} and all its descendants have failed:\n  {reason}\n"
                f"  (actor {self.label})",
                actor=self.label,
                reason=reason,
            )
            self.rt.reply(port, index, STATUS_ERROR, err)


def reply_stopped(rt: Runtime, label: str, port: PortId | None, index: int) -> None:
    """Answer a call to actor ``label``, which was stopped (to ``port``, if any)."""
    if port is not None:
        err = SupervisionError(  # Monarch's sentence first: programs match on it
            f"The actor {label} and all its descendants have failed:\n  actor {label} was stopped",
            actor=label,
            reason="stopped",
        )
        rt.reply(port, index, STATUS_ERROR, err)


def refuse_stopped(rt: Runtime, label: str, header: Any) -> None:
    """Answer a CALL that reached actor ``label`` after it stopped: a broadcast comes
    back to its sender, a call hears "was stopped"."""
    if header.port is None and header.sender is not None:
        rt.bounce(header.sender, f"{label}.{header.method}()", "the actor was stopped")
    else:
        reply_stopped(rt, label, header.port, header.slot)
