"""Monarch's ``monarch.builtins.random``: torch's random state on every proc of the active mesh.

``set_manual_seed_remote(seed, process_idx)`` seeds each proc with
``seed ^ process_idx``; ``get_rng_state_remote()``/``set_rng_state_remote(state)``
save and restore the CPU generator (the state is a mesh tensor); the ``*_cuda_*``
functions do the same for the GPUs each proc sees.
"""

from __future__ import annotations

from .._tensor.builtins import (
    get_rng_state_all_cuda_remote,
    get_rng_state_remote,
    manual_seed_all_cuda_remote,
    manual_seed_cuda_remote,
    random_seed_remote,
    seed_remote,
    set_manual_seed_remote,
    set_rng_state_all_cuda_remote,
    set_rng_state_remote,
)

__all__ = [
    "get_rng_state_all_cuda_remote",
    "get_rng_state_remote",
    "manual_seed_all_cuda_remote",
    "manual_seed_cuda_remote",
    "random_seed_remote",
    "seed_remote",
    "set_manual_seed_remote",
    "set_rng_state_all_cuda_remote",
    "set_rng_state_remote",
]
