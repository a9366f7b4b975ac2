"""``danaus.actor.concurrent``: Monarch's ``monarch.actor.concurrent`` module path.

It holds [`concurrent_endpoint()`][danaus.actor.concurrent_endpoint] (also in ``danaus.actor``): an
async endpoint
whose body runs as a task of the actor's event loop, so the actor takes its next
message while the body awaits.
"""

from __future__ import annotations

from .._actor.api.endpoint import concurrent_endpoint

__all__ = ["concurrent_endpoint"]
