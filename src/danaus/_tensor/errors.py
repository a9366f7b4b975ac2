"""``RemoteTensorError``: a value the client asked for depends on an op that failed on a worker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._errors import DanausError

__all__ = ["Failure", "RemoteTensorError"]


@dataclass(frozen=True)
class Failure:
    """What a worker records in place of a tensor whose computation failed.

    ``op`` is the first op that failed (a dependent tensor inherits its
    producer's failure unchanged); ``rank`` the global rank it failed on.
    """

    op: str
    rank: int
    type_name: str
    message: str
    traceback: str


class RemoteTensorError(DanausError):
    """A fetched tensor (or one it was computed from) failed to compute on a worker.

    ``op`` names the op that failed first, ``ranks`` where, ``remote_traceback``
    the worker's traceback. The worker lives on; tensors that do not depend on
    the failed op can still be used.
    """

    def __init__(self, failure: Failure, fetched_rank: int, labels: dict[str, int]):
        self.failure = failure
        self.op = failure.op
        self.ranks = [failure.rank]
        self.remote_traceback = failure.traceback
        self.coords = labels
        super().__init__(
            f"the tensor fetched from {labels or 'rank ' + str(fetched_rank)} depends on op "
            f"{failure.op} which failed on rank {failure.rank}: "
            f"{failure.type_name}: {failure.message}\n"
            f"Remote traceback (rank {failure.rank}):\n{failure.traceback}"
        )

    def __reduce__(self) -> Any:
        return (RemoteTensorError, (self.failure, self.ranks[0], self.coords))
