"""Monarch's ``monarch.common.remote``: ``remote``, ``call_on_shard_and_fetch`` and the
``DummyProcessGroup`` a ``propagate`` function gets in place of a process group."""

from __future__ import annotations

from .._tensor.groups import DummyProcessGroup
from .._tensor.remote import Remote, call_on_shard_and_fetch, remote

__all__ = ["DummyProcessGroup", "Remote", "call_on_shard_and_fetch", "remote"]
