"""The data plane's errors: a transfer that could not be done, and an owner that died.

::

    RuntimeError, DanausError
     └── RDMAError                    a transfer failed: buffer dropped, no permission, bad memory
          └── RDMAOwnerLostError      ... because the buffer's owner process is gone
                                      (also a SupervisionError)

Misuse (a wrong argument) raises ``TypeError`` / ``ValueError`` at the call;
a transfer that runs out of time fails its future with the builtin
``TimeoutError``.
"""

from __future__ import annotations

from typing import Any

from .._errors import DanausError, SupervisionError

__all__ = ["RDMAError", "RDMAOwnerLostError"]


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

    It is both an :class:`RDMAError` and a ``SupervisionError`` (the owner's
    failure is a supervision event), so either ``except`` clause catches it.
    """

    def __init__(self, message: str, *, buffer: str = "", owner: str = "") -> None:
        SupervisionError.__init__(self, message, actor=owner, reason=message, during="rdma")
        self.buffer = buffer
        self.owner = owner


def _rebuild(cls: type[RDMAError], message: str, buffer: str, owner: str) -> RDMAError:
    return cls(message, buffer=buffer, owner=owner)
