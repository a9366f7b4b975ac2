"""Monarch's ``monarch.simulator.ir``: a program's command graph and its timing keys."""

from __future__ import annotations

from .._sim.ir import Command, IRGraph, TensorAccessEvent, TensorCreationEvent

__all__ = ["Command", "IRGraph", "TensorAccessEvent", "TensorCreationEvent"]
