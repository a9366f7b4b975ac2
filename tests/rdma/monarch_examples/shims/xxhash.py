"""Stand-in for ``xxhash`` where it is not installed: ``xxh64(data).hexdigest()`` only,
over blake2b (the ping-pong example compares digests for equality, nothing more)."""

from __future__ import annotations

import hashlib


class xxh64:
    def __init__(self, data: bytes = b"") -> None:
        self._h = hashlib.blake2b(data, digest_size=8)

    def hexdigest(self) -> str:
        return self._h.hexdigest()
