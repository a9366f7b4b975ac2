"""Monarch's ``monarch.simulator.communication_model``: what collectives and copies cost."""

from __future__ import annotations

from .._sim.comm import (
    LinkClass,
    NetworkConfig,
    collective_time_s,
    estimate_collective_time_us,
    estimate_send_time_us,
    ring_all_reduce_s,
    send_time_s,
    tensor_size_bytes,
    tree_all_reduce_s,
)

__all__ = [
    "LinkClass",
    "NetworkConfig",
    "collective_time_s",
    "estimate_collective_time_us",
    "estimate_send_time_us",
    "ring_all_reduce_s",
    "send_time_s",
    "tensor_size_bytes",
    "tree_all_reduce_s",
]
