"""Monarch's ``monarch.simulator.config``: ``set_meta`` labels the simulator's tasks."""

from __future__ import annotations

from .._tensor.simulator import set_meta

__all__ = ["set_meta"]
