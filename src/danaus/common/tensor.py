"""Monarch's ``monarch.common.tensor``: the mesh tensor class and its reductions."""

from __future__ import annotations

from .._tensor.collectives import reduce, reduce_
from .._tensor.tensor import Tensor

__all__ = ["Tensor", "reduce", "reduce_"]
