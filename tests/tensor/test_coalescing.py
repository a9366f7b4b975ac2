"""``with coalescing():`` holds a block's tensor ops and sends them together at its end."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest

import danaus
from danaus._tensor.engine import engine_for
from danaus.actor import ProcMesh

from . import helpers
from .conftest import REPLY_TIMEOUT, base, local_base, torch

pytestmark = pytest.mark.torch


def _a_sender_pass_sends_nothing(engine: Any) -> bool:
    """Run what the sender thread runs once it has gathered (its send of the queue):
    inside a block it must send nothing and the block's ops stay held by this thread."""
    before = engine.messages_sent
    with engine._send_lock, engine.as_owner():
        engine._send_queued()
    held = engine._client.holding()
    return engine.messages_sent == before and held is not None and len(held.get(engine, ())) > 0


def test_the_ops_of_a_block_leave_together_when_it_ends(mesh: ProcMesh) -> None:
    with mesh.activate():
        engine = engine_for(mesh)
        x = base(mesh)
        with danaus.coalescing():
            sent = engine.messages_sent  # what came before left as the block opened
            y = x
            for _ in range(40):
                y = y + 1
            assert _a_sender_pass_sends_nothing(engine)
        held = engine.messages_sent - sent
        got = danaus.inspect(y, host=1, gpu=1)
    # The ops in one message (one slice, one stream), the intermediates' deletion in one more.
    assert 1 <= held <= 2
    assert torch.equal(got, local_base(1, 1) + 40)


def test_a_nested_block_is_part_of_the_outermost(mesh: ProcMesh) -> None:
    with mesh.activate():
        engine = engine_for(mesh)
        x = base(mesh)
        danaus.inspect(x)
        with danaus.coalescing():
            sent = engine.messages_sent
            with danaus.coalescing():
                y = x * 2
            assert engine.messages_sent == sent  # the inner end sent nothing
            assert _a_sender_pass_sends_nothing(engine)
            z = y + 1
        got = danaus.inspect(z)
    assert torch.equal(got, local_base(0, 0) * 2 + 1)


def test_fetching_inside_a_block_is_refused_and_the_block_still_sends(mesh: ProcMesh) -> None:
    describe = danaus.remote(helpers.describe, propagate=lambda x: None)
    with mesh.activate():
        x = base(mesh)
        with danaus.coalescing():
            y = x + 5
            with pytest.raises(NotImplementedError, match="during a coalescing block"):
                danaus.inspect(y)
            with pytest.raises(NotImplementedError, match="during a coalescing block"):
                danaus.fetch_shard(y, host=0, gpu=1)
            with pytest.raises(NotImplementedError, match="during a coalescing block"):
                describe.call(y)
        got = danaus.inspect(y, host=0, gpu=1)
    assert torch.equal(got, local_base(0, 1) + 5)


def test_ops_issued_just_before_a_block_leave_when_it_opens(mesh: ProcMesh) -> None:
    """What came before the block is not held with it, even when the sender was
    still gathering those ops as the block opened."""
    with mesh.activate():
        engine = engine_for(mesh)
        x = base(mesh)
        danaus.inspect(x)
        before = x * 4  # queued; the sender gathers it for a while before sending
        with danaus.coalescing():
            with engine._cond:
                assert engine._queue == []  # sent as the block opened, not held with it
            inside = before + 1
            assert _a_sender_pass_sends_nothing(engine)
        got = danaus.inspect(inside)
    assert torch.equal(got, local_base(0, 0) * 4 + 1)


def test_a_block_left_by_an_exception_still_sends_its_ops(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = base(mesh)
        with pytest.raises(KeyError), danaus.coalescing():
            y = x * 3
            raise KeyError("the user's own error")
        got = danaus.inspect(y, host=1, gpu=0)
        after = danaus.inspect(x + 1)  # not held any more
    assert torch.equal(got, local_base(1, 0) * 3)
    assert torch.equal(after, local_base(0, 0) + 1)


def _on_thread(work: Callable[[], Any]) -> threading.Thread:
    """Start ``work`` on a new thread; what it returns or raises lands in ``thread.outcome``."""

    def run() -> None:
        try:
            t.outcome = ("ok", work())  # type: ignore[attr-defined]
        except BaseException as e:
            t.outcome = ("raised", e)  # type: ignore[attr-defined]

    t = threading.Thread(target=run, name="coalescing-test-other")
    t.outcome = None  # type: ignore[attr-defined]
    t.start()
    return t


def _outcome(t: threading.Thread) -> Any:
    t.join(REPLY_TIMEOUT)
    assert not t.is_alive(), "the other thread did not finish"
    kind, value = t.outcome  # type: ignore[attr-defined]
    if kind == "raised":
        raise value
    return value


def test_a_block_on_one_thread_neither_refuses_nor_holds_another_threads_work(
    mesh: ProcMesh,
) -> None:
    """A block is per thread: while it is open on this thread, another thread's ops are
    sent and its fetches work (they are not held in this thread's block), and here a
    fetch is still refused."""
    with mesh.activate():
        engine = engine_for(mesh)
        x = base(mesh)
        danaus.inspect(x)
        block_open = threading.Event()

        def other() -> Any:
            assert block_open.wait(REPLY_TIMEOUT)
            with mesh.activate():
                z = x * 2
                # bounded: an op held in the other thread's block would never arrive
                return danaus.fetch_shard(z, host=1, gpu=1).get(timeout=REPLY_TIMEOUT)

        t = _on_thread(other)
        with danaus.coalescing():
            y = x + 5
            block_open.set()
            got_there = _outcome(t)  # its fetch came back: its op was sent, not held here
            held = engine._client.holding()  # only this thread's op is held here
            assert [cmd.outs for _, _, cmd in held[engine]] == [(y._ref,)]
            with pytest.raises(NotImplementedError, match="during a coalescing block"):
                danaus.inspect(y)
        got = danaus.inspect(y, host=0, gpu=1)
    assert torch.equal(got_there, local_base(1, 1) * 2)
    assert torch.equal(got, local_base(0, 1) + 5)


def test_a_tensor_dropped_in_a_block_is_deleted_only_after_the_ops_it_holds(
    mesh: ProcMesh,
) -> None:
    """Another thread's send while a block is open does not send the deletion of a tensor
    the block's held ops still use (it would reach the workers first)."""
    with mesh.activate():
        x = base(mesh) * 3
        danaus.inspect(x)
        with danaus.coalescing():
            y = x + 1
            del x
            gc.collect()

            def other() -> Any:
                with mesh.activate():
                    return danaus.inspect(base(mesh) + 2, host=1, gpu=0)

            got_there = _outcome(_on_thread(other))  # flushes this engine meanwhile
        got = danaus.inspect(y, host=1, gpu=1)
    assert torch.equal(got_there, local_base(1, 0) + 2)
    assert torch.equal(got, local_base(1, 1) * 3 + 1)


def test_ops_torch_runs_for_the_blocks_thread_on_another_join_the_block(
    mesh: ProcMesh,
) -> None:
    """A thread that inherited this thread's dispatch mode (as autograd's device threads
    do for a backward pass) acts for this thread: its ops are held with the block."""
    from danaus._tensor.active import _thread_mode

    with mesh.activate():
        engine = engine_for(mesh)
        x = base(mesh)
        danaus.inspect(x)
        with danaus.coalescing():
            mode = _thread_mode()
            assert mode is not None
            assert engine not in engine._client.holding()

            def inherited() -> Any:
                with mode:  # what torch does on its own threads
                    return x + 7

            w = _outcome(_on_thread(inherited))
            assert engine._client.holding()[engine]  # held here, not sent
        got = danaus.inspect(w, host=0, gpu=1)
    assert torch.equal(got, local_base(0, 1) + 7)
