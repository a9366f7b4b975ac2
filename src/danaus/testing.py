"""``danaus.testing``: helpers for testing programs built on danaus.

``FaultRecorder`` stands in for ``danaus.actor.unhandled_fault_hook`` (whose
default ends the program) and lets a test wait for failures with a timeout::

    recorder = FaultRecorder()
    danaus.actor.unhandled_fault_hook = recorder
    ...
    recorder.crashed("workers", {2})     # exactly rank 2 of "workers" failed
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._supervision.failure import MeshFailure

__all__ = ["FaultRecorder"]

DEFAULT_TIMEOUT = 20.0


class FaultRecorder:
    """Records the failures that reach the client; tests wait for them (never sleep).

    Every ``wait*`` raises ``AssertionError`` naming what arrived if the
    condition does not hold within ``timeout`` seconds, and marks all failures
    so far as seen; ``unseen()`` lists those no test waited for.
    """

    def __init__(self) -> None:
        self.events: list[MeshFailure] = []
        self._seen = 0
        self._cond = threading.Condition()

    def __call__(self, failure: MeshFailure) -> None:
        with self._cond:
            self.events.append(failure)
            self._cond.notify_all()

    def wait_until(
        self,
        done: Callable[[list[MeshFailure]], bool],
        what: str,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> list[MeshFailure]:
        """Block until ``done(all failures so far)``; return them all."""
        with self._cond:
            if not self._cond.wait_for(lambda: done(self.events), timeout):
                raise AssertionError(
                    f"expected {what} to reach the client within {timeout} s, got "
                    f"{[str(e) for e in self.events]}"
                )
            self._seen = len(self.events)
            return list(self.events)

    def wait(self, n: int = 1, timeout: float = DEFAULT_TIMEOUT) -> list[MeshFailure]:
        """Block until ``n`` failures arrived in all; return them all."""
        return self.wait_until(lambda events: len(events) >= n, f"{n} failure(s)", timeout)

    def wait_for(
        self,
        pred: Callable[[list[MeshFailure]], bool],
        what: str,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> list[MeshFailure]:
        """Block until ``pred(failures not yet seen)`` holds; return those."""
        with self._cond:
            ok = self._cond.wait_for(lambda: pred(self.events[self._seen :]), timeout)
            new = self.events[self._seen :]
            if not ok:
                raise AssertionError(
                    f"expected {what} to reach the client within {timeout} s; got "
                    f"{[str(e) for e in new]}"
                )
            self._seen = len(self.events)
            return new

    def crashed(
        self, mesh_name: str, ranks: set[int], timeout: float = DEFAULT_TIMEOUT
    ) -> list[MeshFailure]:
        """Wait for failures of exactly ``ranks`` of ``mesh_name``, and of nothing else."""

        def got(events: list[MeshFailure]) -> bool:
            return {r for e in events if e.mesh_name == mesh_name for r in e.crashed_ranks} >= ranks

        events = self.wait_for(got, f"failures of {mesh_name}{sorted(ranks)}", timeout)
        assert {e.mesh_name for e in events} == {mesh_name}, [str(e) for e in events]
        assert sorted(r for e in events for r in e.crashed_ranks) == sorted(ranks), [
            str(e) for e in events
        ]
        return events

    def mark_seen(self) -> None:
        with self._cond:
            self._seen = len(self.events)

    def unseen(self) -> list[MeshFailure]:
        """The failures no ``wait*`` has returned yet."""
        with self._cond:
            return self.events[self._seen :]
