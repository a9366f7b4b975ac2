"""What a tree of supervisors shares: one queue of failures and the one thread that
handles them, in order."""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from typing import Any, Protocol

log = logging.getLogger("danaus.supervision")


class Member(Protocol):
    """A supervisor of the tree, as its thread calls it (``supervisor.Supervisor``)."""

    name: str

    def _handle(
        self,
        child: Any,
        incarnations: dict[int, int],
        reason: str,
        failed_at: float,
        retry: bool = False,
    ) -> None: ...

    def _give_up(self, failures: list[str], why: str | None = None) -> None: ...

    def _release_root(self) -> None: ...

    def _release_all(self) -> None: ...


class _Tree:
    """One queue of failures, ``(supervisor, child, incarnations, reason, failed_at)``, and
    the thread that hands each to its supervisor; and the events due later (a rank no
    host could take, tried again after a backoff), on the same thread."""

    def __init__(self, name: str) -> None:
        self.lock = threading.Lock()  # guards events, delayed and thread
        self.wake = threading.Condition(self.lock)
        self.events: collections.deque[tuple[Any, ...]] = collections.deque()
        # (due, seq, event), a heap: due is time.monotonic(); seq keeps equal dues in order.
        self.delayed: list[tuple[float, int, tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.thread: threading.Thread | None = None
        self.ended = threading.Event()
        self.name = name

    def later_locked(self, delay: float, event: tuple[Any, ...]) -> None:
        """Queue ``event`` in ``delay`` seconds (lock held); starts the thread if need be."""
        heapq.heappush(self.delayed, (time.monotonic() + delay, next(self._seq), event))
        self.start_locked()
        self.wake.notify()

    def due_locked(self, now: float) -> float | None:
        """Move the delayed events due by ``now`` to the queue (lock held); the seconds
        until the next one is due (None: none waits)."""
        while self.delayed and self.delayed[0][0] <= now:
            self.events.append(heapq.heappop(self.delayed)[2])
        return self.delayed[0][0] - now if self.delayed else None

    def start_locked(self) -> None:
        """Start the thread if it is not running (lock held)."""
        if self.thread is None and not self.ended.is_set():
            self.thread = threading.Thread(
                target=self._run, name=f"danaus-supervisor-{self.name}", daemon=True
            )
            self.thread.start()

    def end(self) -> None:
        with self.lock:
            self.ended.set()
            self.wake.notify_all()

    def _run(self) -> None:
        while True:
            with self.lock:
                while not self.ended.is_set():
                    wait = self.due_locked(time.monotonic())
                    if self.events:
                        break
                    self.wake.wait(wait)
                ended = self.ended.is_set()
                if ended:
                    events = [*self.events, *(ev for _, _, ev in self.delayed)]
                    self.events.clear()
                    self.delayed.clear()
                else:
                    ev = self.events.popleft()
            if ended:
                # Outside the lock: releasing sends the held calls, and a send may wait
                # for the I/O thread, which takes the tree's lock to report failures.
                for left in events:
                    left[0]._release_all()
                return
            sup: Member = ev[0]
            try:
                sup._handle(*ev[1:])
            except Exception as e:  # a restart that cannot be made: the owner must hear
                log.exception("supervisor %r failed to handle a failure", sup.name)
                try:
                    sup._give_up(
                        [str(ev[3])],
                        why=f"supervisor {sup.name!r} gave up: handling the failure "
                        f"({ev[3]}) raised {type(e).__name__}: {e}",
                    )
                except Exception:
                    log.exception("supervisor %r could not give up cleanly", sup.name)
            with self.lock:
                idle = not self.events
            if idle:  # nothing more is coming: no rank should wait any longer
                sup._release_root()
