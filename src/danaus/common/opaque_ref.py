"""Monarch's ``monarch.common.opaque_ref``: ``OpaqueRef``, an object kept on the workers."""

from __future__ import annotations

from .._tensor.opaque_ref import OpaqueRef

__all__ = ["OpaqueRef"]
