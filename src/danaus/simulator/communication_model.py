"""Monarch's ``monarch.simulator.communication_model``: what collectives and copies cost."""

from __future__ import annotations

from .._sim import comm as _comm
from .._sim.comm import LinkClass as LinkClass
from .._sim.comm import NetworkConfig as NetworkConfig
from .._sim.comm import collective_time_s as collective_time_s
from .._sim.comm import estimate_collective_time_us as estimate_collective_time_us
from .._sim.comm import estimate_send_time_us as estimate_send_time_us
from .._sim.comm import ring_all_reduce_s as ring_all_reduce_s
from .._sim.comm import send_time_s as send_time_s
from .._sim.comm import tensor_size_bytes as tensor_size_bytes
from .._sim.comm import tree_all_reduce_s as tree_all_reduce_s

__all__ = _comm.__all__  # each imported above for the reference
