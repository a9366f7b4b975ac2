"""Functions the tensor tests run on workers with ``danaus.remote`` (importable by workers)."""

from __future__ import annotations

from typing import Any

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
