"""The whole danaus exception tree, in one place.

::

    Exception
     ├── DanausError                      base of every error danaus raises itself
     │    ├── ActorError                  an endpoint raised; carries the remote exception
     │    ├── TransportError              a connection between procs failed
     │    │    ├── ConnectionClosedError  ... because we closed it
     │    │    └── PeerBrokenError        ... because the peer broke (EOF, reset, bad frame)
     │    └── InternalError               a bug in danaus; please report it
     └── RuntimeError
          ├── SupervisionError            the actor (or its proc) failed or was stopped
          └── RDMAError (danaus.rdma)     a one-sided transfer failed (also a DanausError)
               ├── RDMAOwnerLostError     ... because the buffer's owner died (also a
               │                          SupervisionError)
               └── RDMATamperedError      ... because bytes were altered on the way

Misuse of the API raises builtin ``TypeError`` / ``ValueError`` /
``RuntimeError`` / ``IndexError`` with a message that quotes the bad value.
``SupervisionError`` is a ``RuntimeError`` (and a ``DanausError``) because
Monarch programs catch it as one.
"""

from __future__ import annotations

import traceback
from typing import Any

__all__ = [
    "ActorError",
    "ConnectionClosedError",
    "DanausError",
    "InternalError",
    "PeerBrokenError",
    "RemoteException",
    "SupervisionError",
    "TransportError",
]


class DanausError(Exception):
    """Base class of every exception danaus raises on its own account."""


class RemoteException(Exception):
    """Stands in for a remote exception that could not be pickled back.

    ``type_name`` is the qualified name of the original type; ``str()`` is its message.
    """

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(type_name, message)
        self.type_name = type_name
        self.message = message

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}"


class ActorError(DanausError):
    """An endpoint raised while handling a call that had a reply.

    ``exception`` is the original exception (or a `RemoteException`
    when it could not travel); ``remote_traceback`` is the traceback text as
    formatted in the remote process, including chained causes. The actor that
    raised it keeps running.
    """

    def __init__(
        self,
        exception: BaseException,
        message: str = "A remote actor call has failed.",
        remote_traceback: str = "",
    ) -> None:
        super().__init__(exception, message, remote_traceback)
        self.exception = exception
        self.message = message
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        tb = self.remote_traceback.rstrip()
        if not tb:
            tb = "".join(traceback.format_exception_only(type(self.exception), self.exception))
        indented = "\n".join("  " + line for line in tb.splitlines())
        return f"{self.message}\n Traceback of where the remote call failed (remote):\n{indented}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.exception, self.message, self.remote_traceback))


class SupervisionError(RuntimeError, DanausError):
    """The actor a call was addressed to has failed or was stopped.

    ``actor`` names the actor (mesh name and rank), ``reason`` says why, and
    ``during`` says what was happening (``"call"``, ``"spawn"``, ``"stop"``).
    """

    def __init__(self, message: str, *, actor: str = "", reason: str = "", during: str = "call"):
        super().__init__(message)
        self.actor = actor
        self.reason = reason
        self.during = during

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_supervision_error, (str(self), self.actor, self.reason, self.during))


def _rebuild_supervision_error(msg: str, actor: str, reason: str, during: str) -> SupervisionError:
    return SupervisionError(msg, actor=actor, reason=reason, during=during)


class TransportError(DanausError):
    """A connection between two procs failed; ``__cause__`` holds the OS error if any."""


class ConnectionClosedError(TransportError):
    """The connection was closed on purpose by this side."""


class PeerBrokenError(TransportError):
    """The peer broke the connection: EOF, reset, or a malformed frame."""


class InternalError(DanausError):
    """A bug in danaus; please report it with the traceback."""
