"""Shared by the large-transfer tests: an actor that returns large out-of-band
buffers, a check of what arrived, and a record of the peers this client lost."""

from __future__ import annotations

import os
import pickle
from typing import Any

from danaus._runtime.node import this_node
from danaus._wire import memory
from danaus.actor import Actor, endpoint


class Blob(Actor):
    @endpoint
    def blob(self, size: int) -> Any:
        # Faulted in without holding the GIL: a bytearray's zero-fill holds it, and on a
        # loaded machine 1 GiB of it outlasted the heartbeat timeout (the user's code
        # freezing its proc, which is not what these tests are about).
        data = memory.anonymous(size)
        data[0], data[size // 2], data[-1] = 1, 2, 3
        return pickle.PickleBuffer(data)  # out of band: offloaded or sent as it is

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def echo(self, x: int) -> int:
        return x


def check_blob(value: Any, size: int) -> None:
    """``value`` is what ``Blob.blob(size)`` made: its length and marked bytes."""
    view = memoryview(value)
    assert view.nbytes == size
    assert (view[0], view[size // 2], view[-1]) == (1, 2, 3)
    assert view[1] == 0 and view[size - 2] == 0


def lost_peers() -> list[str]:
    """A list that fills with ``"name: reason"`` for each peer this client loses."""
    lost: list[str] = []
    rt = this_node().runtime
    rt.peers.lost_callbacks.append(lambda name, reason: lost.append(f"{name}: {reason}"))
    return lost
