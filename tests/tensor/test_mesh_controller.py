"""``danaus.mesh_controller``: Monarch's ``spawn_tensor_engine`` and ``RemoteException``
(its ``test_tensor_engine`` and ``rapid_spawn_exit_stress`` example import them)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import danaus  # noqa: E402
import danaus.mesh_controller  # noqa: E402
from danaus import remote  # noqa: E402
from danaus.actor import this_host  # noqa: E402
from danaus.mesh_controller import DeviceMesh, spawn_tensor_engine  # noqa: E402


@remote(propagate=lambda x: x)
def nope(x):
    raise ValueError("nope")


def test_spawn_compute_exit_and_spawn_again_on_the_same_procs() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        for round_ in range(3):  # exit ends the engine; the procs take a fresh one
            dm = spawn_tensor_engine(procs)
            assert isinstance(dm, DeviceMesh)
            with dm.activate():
                r = danaus.inspect((round_ + 2) * torch.ones(3, 4))
            with dm.flatten("all").activate():
                f = danaus.inspect(2 * torch.ones(3, 4), all=1)
            assert torch.equal(r, torch.full((3, 4), float(round_ + 2)))
            assert torch.equal(f, torch.full((3, 4), 2.0))
            with (
                pytest.raises(danaus.mesh_controller.RemoteException, match="nope"),
                dm.activate(),
            ):
                danaus.inspect(nope(torch.zeros(3, 4)))
            engine = procs._state.tensor_engine
            dm.exit()
            assert engine.closed and procs._state.tensor_engine is None
            dm.exit()  # idempotent
    finally:
        procs.stop().get(timeout=30)


def test_spawn_tensor_engine_refuses_what_is_not_a_running_proc_mesh() -> None:
    with pytest.raises(TypeError, match="expected a ProcMesh"):
        spawn_tensor_engine("procs")  # type: ignore[arg-type]
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    procs.stop().get(timeout=30)
    with pytest.raises(RuntimeError, match="was stopped"):
        spawn_tensor_engine(procs)
