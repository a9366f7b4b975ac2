"""``danaus.spmd``: a torchrun script on a mesh trains exactly as under torchrun."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from danaus._job.spmd import torch_env
from danaus.testing import client_env

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_torch_env_numbers_ranks_row_major_with_the_last_dimension_local() -> None:
    sizes = {"hosts": 2, "gpus": 3}
    env = torch_env({"hosts": 1, "gpus": 2}, sizes)
    assert env == {
        "RANK": "5",
        "LOCAL_RANK": "2",
        "WORLD_SIZE": "6",
        "LOCAL_WORLD_SIZE": "3",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "5",
        "ROLE_WORLD_SIZE": "6",
        "ROLE_NAME": "default",
    }
    three = torch_env({"dc": 1, "hosts": 0, "gpus": 1}, {"dc": 2, "hosts": 2, "gpus": 2})
    assert (three["RANK"], three["GROUP_RANK"], three["GROUP_WORLD_SIZE"]) == ("5", "2", "4")
    with pytest.raises(ValueError, match="at least one dimension"):
        torch_env({}, {})


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_a_ddp_script_on_a_2x2_mesh_ends_with_torchruns_weights(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    env = {**client_env(), "OMP_NUM_THREADS": "1"}
    mesh = subprocess.run(
        [sys.executable, str(EXAMPLES / "spmd_ddp.py"), str(tmp_path / "mesh.pt")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert mesh.returncode == 0, mesh.stderr
    assert "trained on {'hosts': 2, 'gpus': 2}" in mesh.stdout
    ref = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
            str(EXAMPLES / "ddp_train.py"), str(tmp_path / "torchrun.pt"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )  # fmt: skip
    assert ref.returncode == 0, ref.stderr
    ours, theirs = torch.load(tmp_path / "mesh.pt"), torch.load(tmp_path / "torchrun.pt")
    assert list(ours) == list(theirs)
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    torch.manual_seed(0)  # the script's initial weights: training moved them
    initial = torch.nn.Linear(8, 16).state_dict()["weight"]
    assert not torch.equal(ours["0.weight"], initial)
