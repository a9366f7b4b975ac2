"""Functions the tensor tests run on workers with ``danaus.remote`` (importable by workers)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


def add_and_scale(x: torch.Tensor, k: float) -> torch.Tensor:
    return (x + 1) * k


def split_halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x[: x.shape[0] // 2].clone(), x[x.shape[0] // 2 :].clone()


def fill_with_pid_parity(x: torch.Tensor) -> None:
    import os

    x.fill_(os.getpid() % 2)


def double_in_place(x: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x


def describe(x: torch.Tensor) -> dict[str, Any]:
    return {"sum": float(x.sum()), "shape": list(x.shape)}


def fails(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("boom from a remote function")


def exits(x: torch.Tensor) -> torch.Tensor:
    raise SystemExit(3)  # a BaseException, not an Exception: it must not end the stream


# -- gates between streams on one worker (each worker process has its own) --------

_GATES: dict[str, Any] = {}


def _gate(name: str) -> Any:
    import threading

    return _GATES.setdefault(name, threading.Event())  # setdefault is atomic


def wait_for_gate(x: torch.Tensor, name: str, timeout: float) -> torch.Tensor:
    """1.0 if another stream opened gate ``name`` while this one waited, 0.0 if it never did."""
    return torch.tensor(1.0 if _gate(name).wait(timeout) else 0.0)


def open_gate(x: torch.Tensor, name: str) -> torch.Tensor:
    """A copy of ``x`` taken now, then gate ``name`` opens."""
    seen = x.clone()
    _gate(name).set()
    return seen


def hold_then_fill(x: torch.Tensor, name: str, timeout: float, value: float) -> None:
    """Wait for gate ``name`` (at most ``timeout`` s), then fill ``x`` with ``value``."""
    _gate(name).wait(timeout)
    x.fill_(value)


def reset_execution_timer() -> None:
    """Forget this worker's timer's measurements (workers live for the test session)."""
    from danaus.timer import ExecutionTimer

    ExecutionTimer.reset()


# -- OpaqueRef: an object that stays on the workers ------------------------------------


def build_linear(seed: int) -> Any:
    """An ``nn.Linear(3, 4)`` made from ``seed``, kept on the worker behind an OpaqueRef."""
    from danaus.common.opaque_ref import OpaqueRef

    torch.manual_seed(seed)
    return OpaqueRef(torch.nn.Linear(3, 4))


def linear_forward(ref: Any, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ref.value(x)  # type: ignore[no-any-return]


def scale_linear(ref: Any, k: float) -> None:
    """Replace the worker's object behind ``ref`` (``ref.value = ...``)."""
    with torch.no_grad():
        scaled = torch.nn.Linear(3, 4)
        scaled.weight.copy_(ref.value.weight * k)
        scaled.bias.copy_(ref.value.bias * k)
    ref.value = scaled


# -- function_resolvers: a target the default resolvers do not know -----------------------


class Registered:
    """A name in this module's registry of worker functions (``op_<name>``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Registered({self.name!r})"


class RegistryFunction(NamedTuple):
    """What the test resolver sends: the worker looks the name up in this module."""

    name: str

    def resolve(self) -> Any:
        return globals()[f"op_{self.name}"]


def resolve_registered(target: Any) -> RegistryFunction | None:
    return RegistryFunction(target.name) if isinstance(target, Registered) else None


def op_triple(x: torch.Tensor) -> torch.Tensor:
    return x * 3


# -- process groups (danaus.RemoteProcessGroup) ------------------------------------


def all_reduce_in(x: torch.Tensor, pg: Any) -> torch.Tensor:
    """``x`` summed over ``pg`` with torch.distributed (on the client: a dummy, no-op)."""
    import torch.distributed as dist

    y = x.clone()
    dist.all_reduce(y, group=pg)
    return y


def all_gather_in(x: torch.Tensor, pg: Any) -> torch.Tensor:
    import torch.distributed as dist

    out = [torch.empty_like(x) for _ in range(dist.get_world_size(pg))]
    dist.all_gather(out, x, group=pg)
    return torch.stack(out)


def group_facts(pg: Any) -> dict[str, Any]:
    """What a remote function sees of its process group."""
    import torch.distributed as dist

    return {
        "is_process_group": isinstance(pg, dist.ProcessGroup),
        "rank": pg.rank(),
        "size": dist.get_world_size(pg),
        "global_ranks": dist.get_process_group_ranks(pg),
    }


def broadcast_from(
    x: torch.Tensor, pg: Any, src: Any = None, group_src: Any = None
) -> torch.Tensor:
    """``x`` of the member ``src`` (a global rank) or ``group_src`` (a rank in ``pg``)."""
    import torch.distributed as dist

    y = x.clone()
    dist.broadcast(y, src=src, group=pg, group_src=group_src)
    return y


def fails_with(tag: str) -> None:
    raise ValueError(f"failed on purpose: {tag}")
