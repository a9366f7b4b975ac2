"""Errors follow data: a failed op poisons what depends on it, nothing else; dead workers."""

from __future__ import annotations

import os
import signal

import pytest

import danaus
from danaus.actor import ProcMesh, SupervisionError, this_host

from .conftest import REPLY_TIMEOUT, base, local_base, torch

pytestmark = pytest.mark.torch


def test_a_failed_op_fails_its_dependents_and_spares_independent_tensors(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = base(mesh)
        bad_index = torch.tensor([10])  # x has 6 elements: fails on every worker
        bad = x[bad_index]
        dependent = (bad * 2).sum()
        independent = x * 3
    for t in (bad, dependent):
        with pytest.raises(danaus.RemoteTensorError) as info:
            danaus.inspect(t, host=1)
        err = info.value
        assert err.op == "aten::index.Tensor"
        assert err.ranks == [2]  # (host=1, gpu=0)
        assert "IndexError" in str(err) or "out of bounds" in str(err)
        assert "Traceback" in err.remote_traceback
    assert torch.equal(danaus.inspect(independent, host=1), local_base(1, 0) * 3)


def test_a_failure_on_some_ranks_only_names_those_ranks(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = base(mesh)
        i = (mesh.rank("gpu") * 10).reshape(1)  # in range on gpu 0, out of range on gpu 1
        picked = x[i]
    assert torch.equal(danaus.inspect(picked, host=0, gpu=0), torch.tensor([0.0]))
    with pytest.raises(danaus.RemoteTensorError) as info:
        danaus.inspect(picked, host=1, gpu=1)
    assert info.value.ranks == [3]


def test_a_failed_in_place_op_fails_the_tensor_it_writes(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = base(mesh)
        x.add_(x[torch.tensor([99])])
    with pytest.raises(danaus.RemoteTensorError, match=r"aten::index\.Tensor"):
        danaus.inspect(x)


def test_a_collective_whose_input_failed_completes_and_fails_everywhere(mesh: ProcMesh) -> None:
    with mesh.activate():
        x = base(mesh)
        partly_bad = x[(mesh.rank("gpu") * 10).reshape(1)]  # fails on gpu 1 only
        r = partly_bad.reduce("gpu", "sum")
        after = x.reduce("gpu", "sum")  # the group still works for later collectives
    for g in range(2):
        with pytest.raises(danaus.RemoteTensorError) as info:
            danaus.inspect(r, gpu=g)
        assert info.value.ranks == [1]
    assert torch.equal(danaus.inspect(after, host=1), local_base(1, 0) + local_base(1, 1))


def test_the_worker_lives_on_after_a_failed_op(mesh: ProcMesh) -> None:
    with mesh.activate():
        _ = torch.ones(3)[torch.tensor([5])]
        ok = torch.arange(4) + 1
    assert torch.equal(danaus.inspect(ok, host=1, gpu=1), torch.arange(4) + 1)


def test_a_worker_killed_mid_computation_gives_supervision_errors_not_hangs() -> None:
    from danaus._tensor.engine import engine_for

    pm = this_host().spawn_procs(per_host={"gpu": 2})
    try:
        with pm.activate():
            x = torch.ones(64, 64) + pm.rank("gpu")
            summed = danaus.inspect(x.reduce("gpu"), gpu=1)
            with danaus.no_mesh.activate():
                assert torch.equal(summed, torch.full((64, 64), 3.0))
            engine = engine_for(pm)
            pids = [
                v["pid"] for v in engine.workers.info.call().get(timeout=REPLY_TIMEOUT).values()
            ]
            y = x
            for _ in range(20):
                y = (y @ y).tanh()
            r = y.reduce("gpu")
            os.kill(pids[1], signal.SIGKILL)
            with pytest.raises(SupervisionError, match="SIGKILL"):
                danaus.inspect(r, gpu=1)
            # Rank 0 is alive: its half of the collective fails either through the
            # loss of its peer (SupervisionError) or, if gloo sees the reset first,
            # as a failed op (RemoteTensorError). Both are errors at once, not hangs.
            with pytest.raises((SupervisionError, danaus.RemoteTensorError)):
                danaus.inspect(r, gpu=0)
            with pytest.raises(SupervisionError):
                danaus.inspect(x, gpu=0)
            with pytest.raises(SupervisionError, match="lost"):
                x + 1
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)


def test_a_failed_fetch_from_a_dead_worker_breaks_the_engine_before_its_supervision_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The owner's supervision event and the failed fetch travel apart; on a loaded machine
    # the event can come second. Hold it back: what the caller does after seeing the failed
    # fetch must already find the engine broken, not the surviving rank's old values.
    import threading

    from danaus._tensor.engine import Engine, engine_for

    released = threading.Event()
    on_failure = Engine.on_failure

    def held_back(self: Engine, failure: object) -> None:
        released.wait(REPLY_TIMEOUT)
        on_failure(self, failure)

    monkeypatch.setattr(Engine, "on_failure", held_back)
    pm = this_host().spawn_procs(per_host={"gpu": 2})
    try:
        with pm.activate():
            x = torch.ones(4) + pm.rank("gpu")
            engine = engine_for(pm)
            pids = [
                v["pid"] for v in engine.workers.info.call().get(timeout=REPLY_TIMEOUT).values()
            ]
            os.kill(pids[1], signal.SIGKILL)
            with pytest.raises(SupervisionError):
                danaus.inspect(x, gpu=1)
            with pytest.raises(SupervisionError, match="rank"):
                danaus.inspect(x, gpu=0)
            with pytest.raises(SupervisionError, match="lost"):
                x + 1
    finally:
        released.set()
        pm.stop().get(timeout=REPLY_TIMEOUT)
