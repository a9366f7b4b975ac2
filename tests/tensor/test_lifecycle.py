"""Stopping a mesh ends its tensor engine: no thread, rendezvous store or actor is left behind."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import danaus
from danaus.actor import SupervisionError, this_host
from danaus.testing import wait_until

from .conftest import REPLY_TIMEOUT, torch

pytestmark = pytest.mark.torch


_BEFORE: set[threading.Thread] = set()  # threads of other tests' meshes, left alone


def _engine_threads() -> list[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("danaus-tensor") and t not in _BEFORE
    ]


def _stopped(store: Any) -> bool:
    """Whether the rendezvous store actor refuses calls (it was stopped)."""
    try:
        store.store_num_keys.call_one().get(timeout=REPLY_TIMEOUT)
    except SupervisionError:
        return True
    return False


def _cycle() -> Any:
    """Spawn a one-proc mesh, compute on it, stop it; the rendezvous store it used."""
    from danaus._tensor.engine import engine_for

    pm = this_host().spawn_procs(per_host={"gpu": 1})
    with pm.activate():
        engine = engine_for(pm)
        store = engine.store
        value = danaus.inspect(torch.arange(4.0) * 2)
        assert "danaus-tensor-send" in _engine_threads()
    assert torch.equal(value, torch.arange(4.0) * 2)
    pm.stop().get(timeout=REPLY_TIMEOUT)
    assert engine.closed
    with pytest.raises(RuntimeError, match="stopped"):
        engine.send(pm._shape)
    return store


@pytest.mark.timeout(180)
def test_stopping_the_mesh_ends_the_sender_thread_and_the_rendezvous_store() -> None:
    _BEFORE.update(threading.enumerate())
    store = _cycle()
    assert _engine_threads() == []
    assert _stopped(store), "the rendezvous store actor still answers"
    after_one = threading.active_count()
    for _ in range(2):
        store = _cycle()
        assert _engine_threads() == []
        assert _stopped(store)
    wait_until(  # threads that are ending have ended
        threading.active_count,
        REPLY_TIMEOUT,
        f"at most {after_one} threads are left",
        until=lambda n: n <= after_one,
        interval=0.05,
    )


def test_activating_a_stopped_mesh_says_so() -> None:
    pm = this_host().spawn_procs(per_host={"gpu": 1})
    pm.stop().get(timeout=REPLY_TIMEOUT)
    with pytest.raises(RuntimeError, match="was stopped"):
        pm.activate()


_NEW_SESSION = r"""
import torch
import danaus
from danaus.actor import shutdown_context, this_host

pm = this_host().spawn_procs(per_host={"gpu": 1})
pm.activate()  # left open, Monarch-style, when the session ends
comms = danaus.Stream("comms")
streams = comms.activate()
streams.__enter__()
assert danaus.get_active_stream() is comms
block = danaus.coalescing()
block.__enter__()  # left open too: the next session's fetches are not refused
shutdown_context().get(timeout=60)
try:
    danaus.get_active_mesh()
except ValueError:
    pass
else:
    raise AssertionError("the ended session's active mesh is still active")
assert danaus.get_active_stream().name == "main", danaus.get_active_stream()
pm2 = this_host().spawn_procs(per_host={"gpu": 2})
with pm2.activate():
    x = torch.arange(3.0) + pm2.rank("gpu")
    print("VALUE", danaus.inspect(x, gpu=1).tolist())
block.__exit__(None, None, None)  # ends on the ended session's state, harmlessly
pm2.stop().get(timeout=60)
"""


@pytest.mark.timeout(120)
def test_a_new_session_starts_with_no_active_mesh_stream_or_coalescing_block(tmp_path: Any) -> None:
    import subprocess
    import sys

    script = tmp_path / "new_session.py"
    script.write_text(_NEW_SESSION)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "VALUE [1.0, 2.0, 3.0]" in done.stdout
