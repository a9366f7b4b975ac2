"""What a connection's parts ask of the I/O loop they run on."""

from __future__ import annotations

import asyncio
import selectors
import threading
import time
from collections.abc import Callable


def _epoll_of(loop: asyncio.AbstractEventLoop) -> selectors.EpollSelector | None:
    """The loop's epoll selector, when it has one that other threads may adjust."""
    sel = getattr(loop, "_selector", None)
    return sel if isinstance(sel, selectors.EpollSelector) else None


def clock_of(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The loop's clock, ``loop.time``; ``time.monotonic`` itself where that is all
    asyncio's own ``time()`` returns (one Python call less per read of it)."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    tid = getattr(loop, "_thread_id", _NO_TID)  # asyncio's base loop records its thread
    if tid is not _NO_TID:
        return tid == threading.get_ident()
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


_NO_TID = object()
