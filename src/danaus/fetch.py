"""``danaus.fetch``: Monarch's ``monarch.fetch`` module path, fetching tensor shards to the client.

``fetch_shard(obj, shard)`` returns a future of the shard of every mesh tensor in
``obj`` at a coordinate of the active mesh, moved to the client's CPU;
``inspect`` waits for it; ``show`` displays it with ``torchshow``. The same
functions are at the top level (``danaus.fetch_shard``). Importing this module
imports torch (the tensor engine needs it).
"""

from __future__ import annotations

from ._tensor.fetch import fetch_shard, inspect, show
from ._tensor.remote import call_on_shard_and_fetch as call_on_shard_and_fetch

__all__ = ["fetch_shard", "inspect", "show"]
