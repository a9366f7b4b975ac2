"""How one ``call_one`` hears of its proc's loss (``OneCall``), with nothing registered per call.

When the runtime loses a proc it fails the open ports whose handler's
``lost_with`` names it; a port already closed (its reply came) or of another
proc is not told. A call whose port opens after the loss was looked for sends
after the proc's connections closed: its send fails it. Whichever way, a
loss is never missed (the call would wait forever) and a call fails once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from danaus._actor.core.collect import OneCall
from danaus._actor.core.future import Pending
from danaus._errors import SupervisionError
from danaus._runtime.messaging.runtime import Runtime
from danaus._wire.headers import Ping
from danaus._wire.ids import ProcId

PROC = ProcId("gone", "unix:/nonexistent/gone.sock")
OTHER = ProcId("alive", "unix:/nonexistent/alive.sock")


@pytest.fixture
def rt(tmp_path: Any) -> Iterator[Runtime]:
    rt = Runtime("watcher", str(tmp_path))
    rt.peers.expect(PROC)  # a proc spawned for us: the runtime knows it (and may lose it)
    rt.peers.expect(OTHER)
    yield rt
    rt.loop.close()


def _call(rt: Runtime, proc: ProcId) -> tuple[OneCall, Pending]:
    fut = Pending()
    return OneCall(rt, "m.f()", proc, f"m[{proc.name}]", fut), fut


def _failed(fut: Pending) -> str:
    assert fut.done(), "the call was not told of its proc's loss"
    err = fut.exception()
    assert isinstance(err, SupervisionError), err
    return str(err)


def test_the_open_calls_to_a_lost_proc_fail_answered_ones_and_others_do_not(rt: Runtime) -> None:
    _, open_fut = _call(rt, PROC)
    answered, answered_fut = _call(rt, PROC)
    rt.router.close_port(answered.port.port)  # its reply took the port
    other, other_fut = _call(rt, OTHER)
    rt.peers.peer_lost(PROC.name, "it died")
    assert "actor m[gone] is gone with its proc gone: it died" in _failed(open_fut)
    assert not answered_fut.done() and not other_fut.done()
    assert other.port.port in rt.router.ports  # still waiting for its reply


@pytest.mark.parametrize("lost", ["before-the-port-opens", "before-the-send"])
def test_a_loss_around_a_calls_start_is_never_missed(rt: Runtime, lost: str) -> None:
    """The loss lands before the call's port is in the runtime's table (the runtime's
    look misses it) or after (the look finds it): the call fails either way, once."""
    if lost == "before-the-port-opens":
        rt.peers.peer_lost(PROC.name, "it died")
    call, fut = _call(rt, PROC)
    if lost == "before-the-send":
        rt.peers.peer_lost(PROC.name, "it died")
    rt.send(PROC, Ping(), on_fail=call.fail)  # the call's frame, to a lost proc
    assert "is gone with its proc gone: it died" in _failed(fut)
    assert call.port.port not in rt.router.ports
