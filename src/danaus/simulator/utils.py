"""Monarch's ``monarch.simulator.utils``: trace file names and rank ranges."""

from __future__ import annotations

from .._sim.core import compress_workers_range, file_path_with_iter

__all__ = ["clean_name", "compress_workers_range", "file_path_with_iter"]


def clean_name(name: str) -> str:
    """``"torch.ops.aten.mm.default"`` -> ``"aten.mm"`` (how the trace names ops)."""
    if name.startswith("torch.ops.aten."):
        name = name[len("torch.ops.") :]
    if name.endswith(".default"):
        name = name[: -len(".default")]
    return name
