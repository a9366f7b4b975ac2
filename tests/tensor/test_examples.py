"""The tensor examples run to the end on the shared mesh, with the results they promise."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

import danaus
from danaus.actor import ProcMesh

from .conftest import COORDS, base, local_base, torch

pytestmark = pytest.mark.torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ddp_example_matches_one_process_training_after_50_steps(
    mesh: ProcMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    ddp = load("ddp_cpu")
    dist_loss, local_loss = ddp.main(mesh.flatten("dp"))
    assert dist_loss == pytest.approx(local_loss, rel=1e-5, abs=1e-7)
    out = capsys.readouterr().out
    assert f"after {ddp.STEPS} steps" in out
    diff = float(out.split("largest weight difference: ")[1].split()[0])
    assert diff < 1e-5


def test_distributed_tensors_tour_runs_to_the_end(
    mesh: ProcMesh, capsys: pytest.CaptureFixture[str]
) -> None:
    load("distributed_tensors").main(mesh)
    out = capsys.readouterr().out
    assert "recovered from a remote failure of aten::index.Tensor" in out
    assert "(host=1, gpu=1): a=[3.0, 3.0] sum over gpu=[5.0, 5.0] over host=[4.0, 4.0] " in out
    assert "over both=[6.0, 6.0]" in out
    assert "data-parallel step 2" in out
    assert out.rstrip().endswith("done")


def test_a_borrow_on_the_comms_stream_reduces_in_order(mesh: ProcMesh) -> None:
    comms = danaus.Stream("comms")
    assert danaus.get_active_stream().name == "main"
    with mesh.activate():
        g = base(mesh)
        view, borrow = comms.borrow(g, mutable=True)
        with comms.activate():
            assert danaus.get_active_stream() is comms
            view.reduce_("gpu", "sum")
        borrow.drop()
        after = g * 2
    assert borrow.dropped
    for h, gg in COORDS:
        both = local_base(h, 0) + local_base(h, 1)
        assert torch.equal(danaus.inspect(after, host=h, gpu=gg), both * 2)
