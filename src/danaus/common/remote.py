"""Monarch's ``monarch.common.remote``: ``remote`` and ``call_on_shard_and_fetch``."""

from __future__ import annotations

from .._tensor.remote import Remote, call_on_shard_and_fetch, remote

__all__ = ["Remote", "call_on_shard_and_fetch", "remote"]
