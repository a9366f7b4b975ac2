"""``with coalescing():`` holds a block's tensor ops and sends them together at its end."""

from __future__ import annotations

from typing import Any

import pytest

import danaus
from danaus._tensor.engine import engine_for
from danaus.actor import ProcMesh

from . import helpers
from .conftest import base, local_base, torch

pytestmark = pytest.mark.torch


def _a_sender_pass_sends_nothing(engine: Any) -> bool:
    """Run what the sender thread runs once it has gathered (its send of the queue):
    inside a block it must send nothing and leave the block's ops queued."""
    before = engine.messages_sent
    with engine._send_lock, engine.as_owner():
        engine._send_queued(by_sender=True)
    with engine._cond:
        queued = len(engine._queue)
    return engine.messages_sent == before and queued > 0


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
