"""Monarch's ``monarch.common.future``: ``Future``.

Monarch's own class here belongs to its older tensor-engine controller; its
``fetch_shard`` now returns ``monarch.actor.Future``, and so does danaus's. This is
that class, with ``result()``, ``get()``, ``done()``, ``exception()`` and ``await``.
"""

from __future__ import annotations

from .._actor.core.future import Future

__all__ = ["Future"]
