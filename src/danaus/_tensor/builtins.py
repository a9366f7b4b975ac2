"""Monarch's ``monarch.builtins``: remote functions for logging and torch's random state.

Each is a ``remote`` function: call it under an active mesh and it runs on
every proc of the mesh (``.call``/``.call_one`` bring values back). Those with
``propagate="inspect"`` return ``None`` at once; the ``get_*`` ones return mesh
tensors of each proc's state. The public paths are ``danaus.builtins``,
``danaus.builtins.log`` and ``danaus.builtins.random``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .remote import remote

__all__ = [
    "get_rng_state_all_cuda_remote",
    "get_rng_state_remote",
    "log_remote",
    "manual_seed_all_cuda_remote",
    "manual_seed_cuda_remote",
    "random_seed_remote",
    "seed_remote",
    "set_logging_level_remote",
    "set_manual_seed_remote",
    "set_rng_state_all_cuda_remote",
    "set_rng_state_remote",
]

# Not under "danaus": that logger's records go to the job's diagnostics file, and these
# are the user's, for the proc's own log (its output, forwarded to the client).
logger = logging.getLogger("log_remote")


# -- logging ---------------------------------------------------------------------------


@remote(propagate="inspect")
def log_remote(*args: Any, level: int = logging.WARNING, **kwargs: Any) -> None:
    """``logger.log(level, *args, **kwargs)`` on every proc, with the logger ``log_remote``
    (so ``log_remote("step %d", 3)`` logs ``step 3`` as a warning)."""
    logger.log(level, *args, **kwargs)


@remote(propagate="inspect")
def set_logging_level_remote(level: int) -> None:
    """Set the level of ``log_remote``'s logger on every proc."""
    logger.setLevel(level)


# -- torch's random number generators --------------------------------------------------


@remote(propagate="inspect")
def set_manual_seed_remote(seed: int, process_idx: Any = 0) -> None:
    """``torch.manual_seed(seed ^ process_idx)`` on every proc; give ``process_idx``
    (say ``mesh.rank("gpu")``, a mesh tensor) for a different stream per proc."""
    torch.manual_seed(int(seed ^ process_idx))


@remote(propagate=lambda: torch.get_rng_state())
def get_rng_state_remote() -> torch.Tensor:
    """Each proc's CPU generator state (``torch.get_rng_state()``), as a mesh tensor."""
    return torch.get_rng_state()


@remote(propagate="inspect")
def set_rng_state_remote(new_state: torch.Tensor) -> None:
    """``torch.set_rng_state(new_state)`` on every proc (a state from
    ``get_rng_state_remote``)."""
    torch.set_rng_state(new_state)


# Monarch's propagation of the next two runs torch.seed() on the client as well (its
# result is not returned); "inspect" leaves the client's generator alone.
@remote(propagate="inspect")
def seed_remote() -> None:
    """``torch.seed()`` on every proc: a non-deterministic seed each."""
    torch.seed()


@remote(propagate="inspect")
def random_seed_remote() -> None:
    """``torch.random.seed()`` on every proc (the same as ``seed_remote``)."""
    torch.random.seed()


@remote(propagate="inspect")
def manual_seed_cuda_remote(seed: int) -> None:
    """``torch.cuda.manual_seed(seed)`` on every proc (its current GPU)."""
    torch.cuda.manual_seed(seed)


@remote(propagate="inspect")
def manual_seed_all_cuda_remote(seed: int) -> None:
    """``torch.cuda.manual_seed_all(seed)`` on every proc (all the GPUs it sees)."""
    torch.cuda.manual_seed_all(seed)


def _cuda_states() -> list[torch.Tensor]:
    """What ``get_rng_state_all_cuda_remote`` returns, for the client's shapes: one
    16-byte state per GPU, as many as the client sees (at least one). Procs on the
    client's host see as many; elsewhere, give the same number of GPUs."""
    return [torch.empty(16, dtype=torch.uint8) for _ in range(max(1, torch.cuda.device_count()))]


@remote(propagate=_cuda_states)
def get_rng_state_all_cuda_remote() -> list[torch.Tensor]:
    """Each proc's ``torch.cuda.get_rng_state_all()``, as a list of mesh tensors."""
    return torch.cuda.get_rng_state_all()


@remote(propagate="inspect")
def set_rng_state_all_cuda_remote(states: list[torch.Tensor]) -> None:
    """``torch.cuda.set_rng_state_all(states)`` on every proc."""
    torch.cuda.set_rng_state_all(states)
