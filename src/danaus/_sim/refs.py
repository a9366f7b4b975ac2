"""What the simulated engine and the simulated mesh share: the meta device, the refs
in a command's arguments, functions by name, what the client holds, nanoseconds."""

from __future__ import annotations

from typing import Any

import torch

from .._tensor import client
from .._tensor.function import resolve_function
from .._tensor.messages import GroupArg, Ref

_NS = 1_000_000_000


def _ns(seconds: float) -> int:
    return max(0, round(seconds * _NS))


_META = torch.device("meta")


def _is_ref(x: Any) -> bool:
    return isinstance(x, (Ref, GroupArg))


def _resolve(fn: Any) -> Any:
    try:
        return resolve_function(fn)
    except Exception:
        return None


def _client_holding() -> dict[Any, list[Any]] | None:
    state = client.state_if_started()
    return None if state is None else state.holding()
