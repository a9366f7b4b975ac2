"""The listeners part alone: what it refuses, and where it says it listens."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from danaus._runtime.messaging.listening import Listeners
from danaus._transport.state import Transport


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


def listeners(loop: Any, secret: bytes | None, on_loop: list[Any]) -> Listeners:
    t = Transport()
    return Listeners(
        loop,
        "p0",
        "unix:/nowhere/p0.sock",
        t.inproc,
        t.batching,
        secret=secret,
        insecure=False,
        accepted=lambda conn: None,
        dispatch=lambda conn, frame: None,
        on_closed=lambda conn, exc: None,
        call_on_loop=on_loop.append,
        closed=lambda: False,
    )


def test_tcp_without_a_job_secret_is_refused_saying_how_to_set_one(loop: Any) -> None:
    ls = listeners(loop, None, [])
    with pytest.raises(RuntimeError, match=r"without a job secret.*DANAUS_SECRET"):
        ls.listen_tcp("127.0.0.1", "127.0.0.1")
    assert ls.tcp_bind is None and ls.tcp_advertise is None


def test_another_interface_needs_the_tcp_listener_first(loop: Any) -> None:
    with pytest.raises(RuntimeError, match=r"listen_tcp\(\) first"):
        listeners(loop, b"s" * 32, []).listen_tcp_also("127.0.0.2")


def test_listening_on_tcp_advertises_its_port_once(loop: Any) -> None:
    on_loop: list[Any] = []
    ls = listeners(loop, b"s" * 32, on_loop)
    entry, new = ls.listen_tcp("127.0.0.1", "127.0.0.1")
    try:
        port = int(entry.rsplit(":", 1)[1])
        assert new and entry == f"tcp://127.0.0.1:{port}" and port > 0
        assert ls.tcp_bind == "127.0.0.1" and ls.tcp_advertise == "127.0.0.1"
        assert len(on_loop) == 1  # watching the socket is left to the I/O thread
        assert ls.listen_tcp("127.0.0.1", "127.0.0.1") == (entry, False)
    finally:
        ls.close()
