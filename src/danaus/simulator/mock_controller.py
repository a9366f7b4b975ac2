"""Monarch's ``monarch.simulator.mock_controller``: ``MockController``, a controller
without workers.

It takes Monarch's messages (``danaus.common.messages``) from a
``danaus.common.client.Client`` and keeps them (``sent``), runs the members of a
``CommandGroup`` one by one, and ends at ``Exit``. With no workers it has no
values to answer with: ``next_message`` gives ``None``. It is what Monarch's
tests build a ``DeviceMesh`` over; danaus's simulator itself needs no
controller (``danaus.Simulator``).
"""

from __future__ import annotations

import logging
from typing import Any

from ..common import messages

__all__ = ["MockController"]

log = logging.getLogger("danaus.simulator")


class MockController:
    """A controller for ``world_size`` ranks that only records what it is sent."""

    def __init__(self, world_size: int, verbose: bool = True) -> None:
        self.world_size = world_size
        self.verbose = verbose
        self.exited = False
        self.sent: list[tuple[Any, Any]] = []  # (ranks, message), in order

    @property
    def gpu_per_host(self) -> int:
        """Every rank on one host, as Monarch's mock controller says."""
        return self.world_size

    def send(self, ranks: Any, msg: Any) -> None:
        if self.verbose:
            log.info("MockController: %s %s %s", ranks, type(msg), msg)
        if isinstance(msg, messages.CommandGroup):
            for command in msg.commands:
                self.send(ranks, command)
            return
        self.sent.append((ranks, msg))
        if isinstance(msg, messages.Exit):
            self.exited = True

    def next_message(self, timeout: float | None) -> Any:
        """``None``: no workers, so nothing to answer."""
        return None

    def stop_mesh(self) -> None:
        pass

    def drain_and_stop(self) -> list[Any]:
        """The answers still queued (none); ``RuntimeError`` before ``Exit``, as Monarch's."""
        if not self.exited:
            raise RuntimeError("Got drain_and_stop but exited is not True")
        return []

    def drop_refs(self, refs: Any) -> None:
        pass

    def node(self, seq: int, defs: Any, uses: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<MockController of {self.world_size} ranks, {len(self.sent)} messages>"
