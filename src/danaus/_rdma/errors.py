"""The data plane's errors: a transfer that could not be done, and an owner that died.

::

    RuntimeError, DanausError
     └── RDMAError                    a transfer failed: buffer dropped, no permission, bad memory
          ├── RDMAOwnerLostError      ... because the buffer's owner process is gone
          │                           (also a SupervisionError)
          └── RDMATamperedError       ... because a tag check failed: bytes were
                                      altered on the way (across hosts, without TLS)

Warnings Monarch programs import (``RDMATcpFallbackWarning``,
``RDMAReadTransferWarning``, ``RDMAWriteTransferWarning``) exist so that their
``warnings.filterwarnings`` lines keep working; danaus emits none of them: it
has no ibverbs path to fall back from, and it copies straight from and into
the registered memory.

Misuse (a wrong argument) raises ``TypeError`` / ``ValueError`` at the call;
a transfer that runs out of time fails its future with the builtin
``TimeoutError``.
"""

from __future__ import annotations

from typing import Any

from .._errors import DanausError, SupervisionError

__all__ = [
    "RDMAError",
    "RDMAOwnerLostError",
    "RDMAReadTransferWarning",
    "RDMATamperedError",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
]


class RDMATcpFallbackWarning(UserWarning):
    """Monarch: ibverbs unavailable, TCP used instead. Never emitted by danaus."""


class RDMAReadTransferWarning(UserWarning):
    """Monarch: a read needed an extra copy. Never emitted by danaus."""


class RDMAWriteTransferWarning(UserWarning):
    """Monarch: a write needed an extra copy. Never emitted by danaus."""


class RDMAError(RuntimeError, DanausError):
    """An RDMA transfer failed; the message names the buffer, its owner and the cause.

    ``buffer`` is the buffer's description (``str(buf)``), ``owner`` its owner actor.
    """

    def __init__(self, message: str, *, buffer: str = "", owner: str = "") -> None:
        super().__init__(message)
        self.buffer = buffer
        self.owner = owner

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), self.buffer, self.owner))


class RDMAOwnerLostError(RDMAError, SupervisionError):
    """The process that owns the buffer died before or during the transfer.

    It is both an [`RDMAError`][danaus.rdma.RDMAError] and a ``SupervisionError`` (the owner's
    failure is a supervision event), so either ``except`` clause catches it.
    """

    def __init__(self, message: str, *, buffer: str = "", owner: str = "") -> None:
        SupervisionError.__init__(self, message, actor=owner, reason=message, during="rdma")
        self.buffer = buffer
        self.owner = owner


class RDMATamperedError(RDMAError):
    """A tag check of the data connection failed: bytes were altered on the way.

    Raised across hosts when a payload chunk (or an answer) does not match its
    HMAC tag under the connection's session key: someone on the network path
    changed, injected, dropped or reordered bytes. Only verified chunks were
    copied: the destination (the owner's registered memory for a write, the
    local memory for a read) holds none of the altered bytes; the verified
    chunks before the altered one may have landed, as they may when a
    connection breaks. Not the owner's death: the owner may be well.
    """


def _rebuild(cls: type[RDMAError], message: str, buffer: str, owner: str) -> RDMAError:
    return cls(message, buffer=buffer, owner=owner)
