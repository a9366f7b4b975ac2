"""Monarch's ``monarch.simulator.profiling``: what each controller message costs.

``RuntimeEstimator`` prices Monarch's messages (``danaus.common.messages``) in
nanoseconds with Monarch's fixed guesses, which are ``danaus.simulator.FixedCosts``'s
defaults (an op 10 µs, a collective or copy between ranks 100 µs, a copy within
a rank 1 µs, a kernel launch and an event wait 0.5 µs), or with what
``set_custom_timing`` sets. Measuring op costs on this machine is danaus's
``MeasuredCosts`` (``Simulator(costs="measured")``); Monarch's ``RuntimeProfiler``,
which profiles a message on a pool of GPU processes, is not provided.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from .._sim.costs import FixedCosts
from .._sim.workers import KERNEL_LAUNCH_NS
from ..common import messages

__all__ = ["RuntimeEstimator", "RuntimeProfiler", "TimingType"]

TimingFunction = Callable[..., int]

_FIXED = FixedCosts()


class TimingType(str, enum.Enum):
    """What ``RuntimeEstimator.set_custom_timing`` can set (the value is the attribute)."""

    SEND_TENSOR = "_send_tensor_time"
    REDUCE = "_reduce_time"
    CALL_FUNCTION = "_call_function_time"
    KERNEL_LAUNCH = "_kernel_launch_time"
    WAIT_EVENT = "_wait_event_time"


class RuntimeEstimator:
    """The simulated cost, in ns, of a message or of ``"kernel_launch"``/``"wait_event"``."""

    def __init__(self) -> None:
        self._call_function_time: TimingFunction | int | None = None
        self._reduce_time: TimingFunction | int | None = None
        self._send_tensor_time: TimingFunction | int | None = None
        self._wait_event_time: TimingFunction | int | None = None
        self._kernel_launch_time: TimingFunction | int | None = None

    def set_custom_timing(self, func_or_time: dict[TimingType, TimingFunction | int]) -> None:
        """Set the cost of a kind of message: an int of ns, or a function of the message
        (of nothing, for ``KERNEL_LAUNCH`` and ``WAIT_EVENT``) returning ns."""
        for k, v in func_or_time.items():
            if not (isinstance(v, int) or callable(v)):
                raise TypeError(
                    f"set_custom_timing: {k.name} must be an int of nanoseconds or a function "
                    f"returning one, got {v!r}"
                )
            setattr(self, TimingType(k).value, v)

    def _custom(self, attr: str, *args: Any) -> int | None:
        v = getattr(self, attr)
        if v is None:
            return None
        return int(v(*args)) if callable(v) else int(v)

    def get_runtime(self, msg: Any) -> int:
        """The cost of ``msg`` in ns. Raises ``ValueError`` for anything else."""
        if isinstance(msg, messages.CallFunction):
            got = self._custom("_call_function_time", msg)
            return got if got is not None else round(_FIXED.compute * 1e9)
        if isinstance(msg, messages.Reduce):
            got = self._custom("_reduce_time", msg)
            return got if got is not None else round(_FIXED.collective_cost * 1e9)
        if isinstance(msg, messages.SendTensor):
            got = self._custom("_send_tensor_time", msg)
            if got is not None:
                return got
            return 1_000 if msg.from_ranks == msg.to_ranks else round(_FIXED.collective_cost * 1e9)
        if isinstance(msg, str) and msg == "kernel_launch":
            got = self._custom("_kernel_launch_time")
            return got if got is not None else KERNEL_LAUNCH_NS
        if isinstance(msg, str) and msg == "wait_event":
            got = self._custom("_wait_event_time")
            return got if got is not None else 500
        raise ValueError(f"Get an unexpected message for profiling, {msg}.")


class RuntimeProfiler:
    """Not provided: Monarch's profiler of messages on a pool of GPU processes."""

    def __init__(self, world_size: int = 8, port: int = -1) -> None:
        raise NotImplementedError(
            "RuntimeProfiler (Monarch's profiling of messages on GPU worker processes) is "
            "not in danaus: measure op costs on this machine with "
            "danaus.Simulator(..., costs='measured') or danaus.simulator.MeasuredCosts"
        )
