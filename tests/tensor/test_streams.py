"""Streams: ops of different streams run at the same time on a worker, ordered by borrows.

Nothing here measures time. Concurrency is shown with gates (``threading.Event``
objects inside each worker process, see ``helpers``): an op on ``main`` that
waits for a gate which only a later op on ``comms`` opens finishes only if the
two streams run at once. Ordering is shown the other way round: an op waits
briefly for a gate that only an op which must come *after* it opens, so if
the order were not kept the later op would see the value from before.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

import danaus
from danaus.actor import ProcMesh

from . import helpers
from .conftest import COORDS, base, local_base, torch

pytestmark = pytest.mark.torch

_names = itertools.count()


def gate_name() -> str:
    return f"gate-{next(_names)}"


def _scalar(*_: Any) -> Any:
    return torch.empty(())


def _fills_first_arg(x: Any, *_: Any) -> None:
    x.fill_(0.0)  # on meta tensors: tells remote() that x is written in place


wait_for_gate = danaus.remote(helpers.wait_for_gate, propagate=_scalar)
open_gate = danaus.remote(helpers.open_gate, propagate=lambda x, name: x.clone())
hold_then_fill = danaus.remote(helpers.hold_then_fill, propagate=_fills_first_arg)

# long enough never to pass by itself when the streams do run at once
SAFETY_S = 30.0
# how long an op waits for a gate that, when ordering is right, never opens
BRIEF_S = 1.0


def test_ops_on_another_stream_run_while_main_is_blocked(mesh: ProcMesh) -> None:
    comms = danaus.Stream("comms")
    name = gate_name()
    with mesh.activate():
        waited = wait_for_gate(base(mesh), name, SAFETY_S)  # main: blocks on the gate
        with comms.activate():
            # comms: a collective and then the gate, issued after main's wait
            total = base(mesh).reduce("gpu", "sum")
            opened = open_gate(total, name)
    for h, g in COORDS:
        assert float(danaus.inspect(waited, host=h, gpu=g)) == 1.0, "the streams ran one by one"
        both = local_base(h, 0) + local_base(h, 1)
        assert torch.equal(danaus.inspect(opened, host=h, gpu=g), both)


def test_a_borrow_waits_for_the_origin_streams_earlier_ops(mesh: ProcMesh) -> None:
    comms = danaus.Stream("comms")
    name = gate_name()
    with mesh.activate():
        x = torch.zeros(3)
        hold_then_fill(x, name, BRIEF_S, 5.0)  # main: writes 5 after waiting for the gate
        view, borrow = comms.borrow(x)
        with comms.activate():
            seen = open_gate(view, name)  # reads, then opens the gate
        borrow.drop()
    for h, g in COORDS:
        assert torch.equal(danaus.inspect(seen, host=h, gpu=g), torch.full((3,), 5.0))


def test_dropping_a_borrow_makes_the_origin_wait_for_the_borrowers_ops(mesh: ProcMesh) -> None:
    comms = danaus.Stream("comms")
    name = gate_name()
    with mesh.activate():
        x = torch.zeros(3)
        view, borrow = comms.borrow(x, mutable=True)
        with comms.activate():
            hold_then_fill(view, name, BRIEF_S, 7.0)  # comms: writes 7 after the gate
        borrow.drop()
        seen = open_gate(x, name)  # main, after the drop: reads, then opens the gate
    for h, g in COORDS:
        assert torch.equal(danaus.inspect(seen, host=h, gpu=g), torch.full((3,), 7.0))
        assert torch.equal(danaus.inspect(x, host=h, gpu=g), torch.full((3,), 7.0))


def test_a_reduction_on_comms_of_a_borrowed_gradient_lands_in_the_original(
    mesh: ProcMesh,
) -> None:
    comms = danaus.Stream("comms")
    with mesh.activate():
        g = base(mesh) * 2
        view, borrow = comms.borrow(g, mutable=True)
        with comms.activate():
            view.reduce_("host", "sum")
        borrow.drop()
        after = g + 1
    for h, gg in COORDS:
        both = (local_base(0, gg) + local_base(1, gg)) * 2
        assert torch.equal(danaus.inspect(after, host=h, gpu=gg), both + 1)


def test_stream_rules_are_checked_on_the_client(mesh: ProcMesh) -> None:
    comms = danaus.Stream("comms")
    with mesh.activate():
        x = torch.ones(3)
        with comms.activate():
            with pytest.raises(ValueError, match="active stream is <Stream 'comms'>"):
                x + 1
            with pytest.raises(ValueError, match="active stream"):
                x.reduce("gpu")
        view, borrow = comms.borrow(x, mutable=True)
        assert "stream='comms'" in repr(view)
        with pytest.raises(ValueError, match="active stream"):
            view + 1  # on comms: refused on main (and used on comms below)
        with pytest.raises(ValueError, match="lent mutably"):
            x * 2
        with pytest.raises(ValueError, match="Cannot borrow"):
            comms.borrow(x)
        with comms.activate():
            row = view[0:2]  # a view of the borrowed view ends with the borrow
            doubled = view * 2  # a new tensor does not
        borrow.drop()
        borrow.drop()  # idempotent
        y = x + 1  # the original is usable again
        with comms.activate():
            with pytest.raises(ValueError, match="dropped"):
                view + 1
            with pytest.raises(ValueError, match="dropped"):
                row + 1
            kept = doubled + 1
        _frozen, shared = comms.borrow(y)
        with pytest.raises(ValueError, match="read only"):
            y.add_(1)
        with pytest.raises(ValueError, match="mutably"):
            comms.borrow(y, mutable=True)
        with pytest.raises(ValueError, match="already on"):
            danaus.get_active_stream().borrow(y)
        z = y * 3  # reading while lent immutably is fine
        shared.drop()
    assert torch.equal(danaus.inspect(z), torch.full((3,), 6.0))
    assert torch.equal(danaus.inspect(kept), torch.full((3,), 3.0))
    assert danaus.get_active_stream().name == "main"


def test_a_failure_on_a_mutable_borrow_passes_back_to_the_original(mesh: ProcMesh) -> None:
    comms = danaus.Stream("comms")
    with mesh.activate():
        x = torch.ones(3)
        view, borrow = comms.borrow(x, mutable=True)
        with comms.activate():
            view.add_(view[torch.tensor([7])])  # index out of range: fails on every worker
        borrow.drop()
        dependent = x * 2
        fine = torch.ones(2)
    with pytest.raises(danaus.RemoteTensorError, match=r"aten::index\.Tensor"):
        danaus.inspect(dependent)
    assert torch.equal(danaus.inspect(fine), torch.ones(2))


def test_borrowing_a_view_lends_the_whole_storage_as_monarch(mesh: ProcMesh) -> None:
    comms = danaus.Stream("comms")
    with mesh.activate():
        x = torch.ones(4, 3)
        other_row = x[0]  # a view made before the borrow shares x's storage
        view, borrow = comms.borrow(x[1], mutable=True)
        assert view.shape == (3,)
        for use in (lambda: x * 2, lambda: other_row + 1, lambda: x[2]):
            with pytest.raises(ValueError, match="lent mutably"):
                use()
        with pytest.raises(ValueError, match="Cannot borrow"):
            comms.borrow(other_row)
        with comms.activate():
            view.add_(10)  # writes row 1 of x on every worker
            head = view[0:2]  # a view of the borrowed tensor: ends with the borrow
            head.mul_(2)
        borrow.drop()
        with comms.activate(), pytest.raises(ValueError, match="dropped"):
            head + 1
        after_mutable = x + 0  # usable again, and sees the borrower's writes
        # two immutable borrows of different views: x stays read only until both are dropped
        _c0, b0 = comms.borrow(x[:, 0])
        _c1, b1 = comms.borrow(x[:, 1])
        with pytest.raises(ValueError, match="read only"):
            x.add_(1)
        with pytest.raises(ValueError, match="mutably"):
            comms.borrow(x, mutable=True)
        read = other_row * 3  # reading is fine while lent immutably
        b0.drop()
        with pytest.raises(ValueError, match="read only"):
            other_row.zero_()
        b1.drop()
        x.add_(1)
    expect = torch.ones(4, 3)
    expect[1] += 10
    expect[1, 0:2] *= 2
    assert torch.equal(danaus.inspect(after_mutable, host=1, gpu=0), expect)
    assert torch.equal(danaus.inspect(read), torch.full((3,), 3.0))
    assert torch.equal(danaus.inspect(x, host=0, gpu=1), expect + 1)


def test_a_command_that_raises_does_not_skip_the_rest_of_its_batch() -> None:
    # Commands record their own failures; one that raises anyway (a bug) used to end its
    # whole batch, and a hand-off later in that batch never reached the actor waiting
    # for it (blocked for good).
    import threading

    from danaus._tensor.worker_streams import StreamRunner

    ran: list[str] = []
    done = threading.Event()

    def run_one(cmd: str) -> None:
        if cmd == "bug":
            raise TypeError("unknown tensor engine command")
        ran.append(cmd)
        if cmd == "hand-off":
            done.set()

    runner = StreamRunner("test", run_one, torch.device("cpu"))
    runner.put(["first", "bug", "hand-off"])
    assert done.wait(30)
    runner.stop()
    runner.thread.join(30)
    assert ran == ["first", "hand-off"]


def test_a_gradient_bucket_is_reduced_in_place_through_an_immutable_borrow(mesh) -> None:
    # Monarch's idiom for overlapping the all-reduce with compute: borrow the flat
    # gradients to a comms stream (immutably), reduce_ them there, drop the borrow.
    comms = danaus.Stream("reducer")
    with mesh.activate():
        flat = torch.ones(6) * (mesh.rank("gpu") + 1)
        lent, borrow = comms.borrow(flat)
        with comms.activate():
            lent.reduce_("gpu", reduction="avg")
        borrow.drop()
        after = flat + 0
    assert torch.equal(danaus.inspect(after, host=0, gpu=1), torch.full((6,), 1.5))
