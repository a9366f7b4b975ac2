"""The one-sided copy primitives, shared with the transport (``danaus._transport.vm``)."""

from __future__ import annotations

from .._transport import vm as _vm
from .._transport.vm import *  # noqa: F403  (the names of its __all__)

__all__ = _vm.__all__
