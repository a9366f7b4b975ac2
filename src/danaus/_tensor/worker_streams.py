"""A worker's streams: one thread (and, on CUDA, one CUDA stream) per named stream.

The worker actor's thread only sorts incoming batches of commands into the
queue of the stream they were issued on; each stream's thread runs its
queue in order, so ops on different streams run at the same time (torch
ops and gloo collectives release the GIL). Streams meet only where the
client put a ``Signal``/``Wait`` pair (a borrow or its drop): a waiting
stream runs nothing further until the other stream has run everything it
was given before the signal. Every wait points back in issue order, so no
wait can form a cycle.

    actor thread ── run("main", [...]) ──▶ queue ─▶ thread "main"
                 ── run("comms", [...]) ─▶ queue ─▶ thread "comms"
                 ── fetch(ids) : barrier on every stream, then read
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["StreamRunner", "Streams", "current_stream"]

log = logging.getLogger("danaus.tensor")

# Per thread, not a node part: the name of the stream a stream thread runs.
_local = threading.local()


def current_stream() -> str:
    """The name of the stream whose thread is calling (``"main"`` off stream threads)."""
    return getattr(_local, "name", "main")


_STOP = object()


class StreamRunner:
    """One stream on one worker: a thread running batches of commands in order."""

    def __init__(self, name: str, run_one: Callable[[Any], None], device: torch.device) -> None:
        self.name = name
        self._run_one = run_one
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.cuda_stream: Any = None
        if device.type == "cuda":
            # the default stream for "main", a stream of its own for every other one
            self.cuda_stream = (
                torch.cuda.current_stream(device)
                if name == "main"
                else torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
            )
        self.thread = threading.Thread(target=self._loop, name=f"danaus-stream-{name}", daemon=True)
        self.thread.start()

    def put(self, item: Any) -> None:
        """Queue a batch (a list of commands) or a callable, to run after what is queued."""
        self._q.put(item)

    def stop(self) -> None:
        self._q.put(_STOP)

    def _loop(self) -> None:
        _local.name = self.name
        # OpenMP's thread count is per thread: a new thread would use the default (every
        # core) whatever the process set, and tiny ops then cost milliseconds when procs
        # share cores. Take the process's setting.
        torch.set_num_threads(torch.get_num_threads())
        if self.cuda_stream is not None:
            torch.cuda.set_device(self.cuda_stream.device)
            with torch.cuda.stream(self.cuda_stream):
                self._drain()
        else:
            self._drain()

    def _drain(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            if callable(item):
                try:
                    item()
                except BaseException:  # a bug: commands record their own failures
                    log.exception("tensor engine stream %r: a task raised", self.name)
                continue
            for cmd in item:
                try:
                    self._run_one(cmd)
                except BaseException:  # a bug: commands record their own failures
                    # The rest of the batch still runs: a hand-off among them is what
                    # an actor waits for, and skipping it would block that actor.
                    log.exception("tensor engine stream %r: a command raised", self.name)


class _Event:
    """A point in one stream that another waits for (a CPU event, plus a CUDA one on GPUs)."""

    __slots__ = ("cuda", "flag")

    def __init__(self) -> None:
        self.flag = threading.Event()
        self.cuda: Any = None


class Streams:
    """The streams of one worker, created on first use, and the events between them."""

    def __init__(self, run_one: Callable[[Any], None], device: torch.device) -> None:
        self._run_one = run_one
        self.device = device
        self._runners: dict[str, StreamRunner] = {}
        self._events: dict[int, _Event] = {}
        self._lock = threading.Lock()  # guards _events (stream threads record and wait on them)

    def submit(self, stream: str, commands: list[Any]) -> None:
        """Queue ``commands`` on ``stream`` (made at its first use). Called on the actor thread."""
        runner = self._runners.get(stream)
        if runner is None:
            runner = self._runners[stream] = StreamRunner(stream, self._run_one, self.device)
        runner.put(commands)

    def _event(self, key: int) -> _Event:
        with self._lock:
            ev = self._events.get(key)
            if ev is None:
                ev = self._events[key] = _Event()
            return ev

    def signal(self, key: int) -> None:
        """On a stream's thread: everything this stream ran so far is done (event ``key``)."""
        ev = self._event(key)
        if self.device.type == "cuda":
            ev.cuda = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ev.cuda.record()
        ev.flag.set()

    def wait(self, key: int) -> None:
        """On a stream's thread: block this stream until ``signal(key)`` has run."""
        ev = self._event(key)
        ev.flag.wait()
        with self._lock:
            self._events.pop(key, None)
        if ev.cuda is not None:
            torch.cuda.current_stream().wait_event(ev.cuda)

    def barrier(self) -> None:
        """Block until every stream has run what was queued on it before this call."""
        done = []
        for runner in list(self._runners.values()):
            flag = threading.Event()

            def reached(flag: threading.Event = flag) -> None:
                if self.device.type == "cuda":
                    torch.cuda.current_stream().synchronize()
                flag.set()

            runner.put(reached)
            done.append(flag)
        for flag in done:
            flag.wait()

    def close(self) -> None:
        """Stop every stream's thread after what is queued (does not wait for them)."""
        for runner in self._runners.values():
            runner.stop()
        self._runners.clear()

    def threads(self) -> list[threading.Thread]:
        return [r.thread for r in self._runners.values()]
