"""``danaus.timer``: Monarch's execution timer, timing GPU work with CUDA events.

``ExecutionTimer.time(name)`` (or ``start(name)``/``stop(name)``) measures a
section: with CUDA events on the current stream when CUDA is available and
``use_cpu`` is false (the time the GPU spent between the two points), with
``time.perf_counter`` otherwise. A CUDA measurement is read, waiting for its
end event, only when asked for (``summary``, ``get_latest_measurement``), so
timing never blocks the code it times and no thread polls the events.

The methods called on the class (``ExecutionTimer.start(...)``, as Monarch's
programs do) use the process's timer, ``ExecutionTimer.default()``; an
instance (``ExecutionTimer()``) is a timer of its own. The module functions
(``execution_timer_start``, ...) use the process's timer too and are what a
program runs on its workers with ``remote("danaus.timer.remote_execution_timer.
execution_timer_start", propagate="inspect")``: each proc times its own work.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = [
    "ExecutionTimer",
    "execution_timer_start",
    "execution_timer_stop",
    "get_execution_timer_average_ms",
    "get_execution_timer_summary",
    "get_latest_timer_measurement",
    "get_time_perfcounter",
]

logger = logging.getLogger(__name__)

DEFAULT = "default"


class _Either:
    """A method that runs on the instance it is called on, or, called on the class,
    on the class's process-wide timer (``ExecutionTimer.default()``)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    def __get__(self, obj: Any, cls: Any) -> Any:
        target = obj if obj is not None else cls.default()
        return self._fn.__get__(target, cls)


class _CudaSection:
    """A CUDA measurement: two timing events on one stream, read once the end one ran."""

    __slots__ = ("end", "start", "stream")

    def __init__(self) -> None:
        self.stream = torch.cuda.current_stream()
        self.start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self.end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        self.start.record(self.stream)

    def elapsed_ms(self) -> float:
        self.end.synchronize()
        return float(self.start.elapsed_time(self.end))


class ExecutionTimer:
    """A lightweight timer of named sections, in milliseconds, as Monarch's.

    Sections with the same name may nest: ``stop(name)`` ends the latest
    ``start(name)`` not yet stopped. Thread-safe. Call the methods on the class
    to use the process's timer, or on an instance of your own.
    """

    _default: ExecutionTimer | None = None  # the process's timer, made on first use
    _default_lock = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # per name, the measurements in the order their sections stopped: a number of
        # milliseconds, or a CUDA section not read yet
        self._times: dict[str, list[float | _CudaSection]] = {}
        # per name, the sections started and not stopped, latest last: a
        # perf_counter() value or a CUDA section whose end is not recorded yet
        self._open: dict[str, list[float | _CudaSection]] = {}
        self._warned = False

    @classmethod
    def default(cls) -> ExecutionTimer:
        """The process's timer: the one the methods called on the class use."""
        timer = cls._default
        if timer is None:
            with cls._default_lock:
                if cls._default is None:
                    cls._default = cls()
                timer = cls._default
        return timer

    @_Either
    @contextlib.contextmanager
    def time(self, name: str | None = None, use_cpu: bool = False) -> Iterator[None]:
        """Time the block as section ``name`` (``"default"`` when omitted)::

        with ExecutionTimer.time("matmul"):
            torch.matmul(a, b)
        """
        self.start(name, use_cpu)
        try:
            yield
        finally:
            self.stop(name, use_cpu)

    @_Either
    def start(self, name: str | None = None, use_cpu: bool = False) -> None:
        """Start timing section ``name``: with CUDA events on the current stream when CUDA
        is available and ``use_cpu`` is false, on the CPU's clock otherwise."""
        name = _name(name)
        mark: float | _CudaSection
        if not use_cpu and torch.cuda.is_available():
            mark = _CudaSection()
        else:
            if not use_cpu and not self._warned:
                self._warned = True
                logger.warning("CUDA is not available: ExecutionTimer times on the CPU")
            mark = time.perf_counter()
        with self._lock:
            self._open.setdefault(name, []).append(mark)

    @_Either
    def stop(self, name: str | None = None, use_cpu: bool = False) -> None:
        """End the latest section ``name`` started and not stopped, and record its time.

        ``use_cpu`` is accepted for Monarch's signature; the section ends the way it
        started. Raises ``RuntimeError`` when no section ``name`` is running.
        """
        now = time.perf_counter()
        name = _name(name)
        with self._lock:
            running = self._open.get(name)
            if not running:
                raise RuntimeError(
                    f"ExecutionTimer.stop({name!r}): no section {name!r} is running; "
                    f"call start({name!r}) first (running: {sorted(self._open)})"
                )
            mark = running.pop()
            if not running:
                del self._open[name]
            times = self._times.setdefault(name, [])
            if isinstance(mark, _CudaSection):
                mark.end.record(mark.stream)
                # earlier sections whose end has run become numbers: a loop that times
                # every step and never reads keeps a few events, not one pair per step
                first = len(times)  # the unread sections are at the end, in order
                while first > 0 and isinstance(times[first - 1], _CudaSection):
                    first -= 1
                for i in range(first, len(times)):
                    t = times[i]
                    if not isinstance(t, _CudaSection) or not t.end.query():  # type: ignore[no-untyped-call]
                        break
                    times[i] = t.elapsed_ms()
                times.append(mark)
            else:
                times.append((now - mark) * 1000.0)

    @_Either
    def reset(self) -> None:
        """Forget every measurement. Sections still running go on and are recorded when
        they stop."""
        with self._lock:
            self._times = {}

    def _read(self, name: str | None = None) -> dict[str, list[float]]:
        """The measurements (of ``name``, or of all sections), CUDA ones read (this waits
        for their end events)."""
        with self._lock:
            names = list(self._times) if name is None else [name]
            pending = {n: list(self._times.get(n, ())) for n in names}
        done: dict[str, list[float]] = {}
        for n, marks in pending.items():
            values = [m.elapsed_ms() if isinstance(m, _CudaSection) else m for m in marks]
            done[n] = values
        with self._lock:  # store what was read, unless a reset came in between
            for n, values in done.items():
                current = self._times.get(n)
                if current is not None and len(current) >= len(values):
                    for i, v in enumerate(values):
                        if current[i] is pending[n][i]:
                            current[i] = v
        return done

    @_Either
    def summary(self) -> dict[str, dict[str, float]]:
        """Per section measured: ``count``, ``mean_ms``, ``total_ms``, ``min_ms``,
        ``max_ms``. Waits for the CUDA sections' end events."""
        return {
            name: {
                "count": len(times),
                "mean_ms": sum(times) / len(times),
                "total_ms": sum(times),
                "min_ms": min(times),
                "max_ms": max(times),
            }
            for name, times in self._read().items()
            if times
        }

    @_Either
    def get_latest_measurement(self, name: str | None = None) -> float:
        """The last measurement of section ``name``, in ms; 0.0 (and a warning) when it
        has none, as Monarch's. Waits for its CUDA end event."""
        name = _name(name)
        with self._lock:
            last = self._times.get(name, [])[-1:]
        if not last:
            logger.warning("ExecutionTimer: section %r has no measurement", name)
            return 0.0
        mark = last[0]
        return mark.elapsed_ms() if isinstance(mark, _CudaSection) else mark

    @_Either
    def print_summary(self) -> None:
        """Print the summary as a table, one section a line."""
        rows = self.summary()
        if not rows:
            print("ExecutionTimer: no measurements")
            return
        width = max(len("section"), *(len(n) for n in rows))
        print(
            f"{'section':<{width}}  {'count':>6}  {'mean ms':>10}  {'total ms':>10}  "
            f"{'min ms':>10}  {'max ms':>10}"
        )
        for name, s in rows.items():
            print(
                f"{name:<{width}}  {s['count']:>6}  {s['mean_ms']:>10.3f}  "
                f"{s['total_ms']:>10.3f}  {s['min_ms']:>10.3f}  {s['max_ms']:>10.3f}"
            )


def _name(name: str | None) -> str:
    if name is None or name == "":
        return DEFAULT
    if not isinstance(name, str):
        raise TypeError(f"a timer section's name must be a string, got {name!r}")
    return name


def execution_timer_start(name: str | None = None, use_cpu: bool = False) -> None:
    """Start section ``name`` of the process's timer (``ExecutionTimer.start``)."""
    ExecutionTimer.default().start(name, use_cpu)


def execution_timer_stop(name: str | None = None, use_cpu: bool = False) -> None:
    """Stop section ``name`` of the process's timer (``ExecutionTimer.stop``)."""
    ExecutionTimer.default().stop(name, use_cpu)


def get_execution_timer_average_ms(name: str = DEFAULT) -> torch.Tensor:
    """The mean time of section ``name`` of the process's timer, in ms, as a float64
    scalar tensor. Raises ``KeyError`` when the section has no measurement."""
    summary = ExecutionTimer.default().summary()
    if name not in summary:
        raise KeyError(
            f"ExecutionTimer has no measurement of section {name!r}; measured: {sorted(summary)}"
        )
    return torch.tensor(summary[name]["mean_ms"], dtype=torch.float64)


def get_latest_timer_measurement(name: str | None = None) -> torch.Tensor:
    """The last measurement of section ``name`` of the process's timer, in ms, as a
    float64 scalar tensor (0.0 when there is none)."""
    return torch.tensor(ExecutionTimer.default().get_latest_measurement(name), dtype=torch.float64)


def get_execution_timer_summary() -> dict[str, dict[str, float]]:
    """The process's timer's ``summary()``."""
    summary: dict[str, dict[str, float]] = ExecutionTimer.default().summary()
    return summary


def get_time_perfcounter() -> torch.Tensor:
    """``time.perf_counter()`` as a float64 scalar tensor (seconds; for debugging)."""
    return torch.tensor(time.perf_counter(), dtype=torch.float64)
