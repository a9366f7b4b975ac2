"""``danaus.spmd``: a torchrun script on a mesh trains exactly as under torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from danaus.testing import client_env

from .conftest import Scripts, Slurm, free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def torchrun_weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The weights of ``torchrun --standalone --nproc-per-node 4 examples/ddp_train.py``."""
    torch = pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("torchrun")
    ref = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
            str(EXAMPLES / "ddp_train.py"), str(d / "torchrun.pt"),
        ],
        cwd=d,
        env={**client_env(), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=200,
    )  # fmt: skip
    assert ref.returncode == 0, ref.stderr
    weights: dict[str, Any] = torch.load(d / "torchrun.pt")
    return weights


def _assert_same_weights(path: Path, theirs: dict[str, Any]) -> None:
    import torch

    ours = torch.load(path)
    assert list(ours) == list(theirs)
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    torch.manual_seed(0)  # the script's initial weights: training moved them
    assert not torch.equal(ours["0.weight"], torch.nn.Linear(8, 16).state_dict()["weight"])


@pytest.mark.torch
@pytest.mark.slow  # the Slurm test below runs the same comparison across namespace hosts
@pytest.mark.timeout(240)
def test_the_example_on_local_hosts_ends_with_torchruns_weights(
    tmp_path: Path, torchrun_weights: dict[str, Any]
) -> None:
    mesh = subprocess.run(
        [sys.executable, str(EXAMPLES / "spmd_ddp.py"), str(tmp_path / "mesh.pt")],
        cwd=tmp_path,
        env={**client_env(), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert mesh.returncode == 0, mesh.stderr
    assert "trained on {'hosts': 2, 'gpus': 2}" in mesh.stdout
    _assert_same_weights(tmp_path / "mesh.pt", torchrun_weights)


ON_NAMESPACE_HOSTS = """
    import sys
    from pathlib import Path
    from danaus.actor import attach_to_workers
    from danaus.spmd import SPMDActor
    from danaus.tools.config import Workspace

    workers, secret, code, out = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]
    hosts = attach_to_workers(workers=workers, secret=secret)
    # The hosts share no directory with us: the script reaches them by code sync.
    hosts.sync_workspace(Workspace(dirs={code: "spmd_example"})).get(timeout=60)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    actors = procs.spawn("spmd", SPMDActor)
    addr, port = actors.slice(hosts=0, gpus=0).get_host_port.call_one(None).get()
    print(addr, flush=True)
    actors.main.call(addr, port, ["-m", "ddp_train", out]).get(timeout=200)
    procs.stop().get(timeout=60)
    hosts.stop().get(timeout=30)  # the workers stay for the next test's client
"""


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_the_script_synced_to_two_namespace_hosts_ends_with_torchruns_weights(
    private_hosts: dict[str, Any], scripts: Scripts, torchrun_weights: dict[str, Any]
) -> None:
    scripts.env = {"OMP_NUM_THREADS": "1"}
    code = scripts.tmp_path / "code"
    code.mkdir()
    (code / "ddp_train.py").write_text((EXAMPLES / "ddp_train.py").read_text())
    out = scripts.tmp_path / "namespaces.pt"  # rank 0 saves it (a shared path, for the test)
    workers = ",".join(private_hosts["workers"])
    path = scripts.write(ON_NAMESPACE_HOSTS)
    client = scripts.start_path(path, workers, private_hosts["secret"], str(code), str(out))
    stdout, err = client.communicate(timeout=220)
    assert client.returncode == 0, err
    mine = [line for line in stdout.splitlines() if not line.startswith("[")]  # procs' lines
    assert mine == [private_hosts["workers"][0].split("//")[1].rsplit(":", 1)[0]]
    assert any(line.startswith("[spmd {hosts=") for line in stdout.splitlines())
    _assert_same_weights(out, torchrun_weights)


ON_SLURM = """
    import sys
    from danaus.job import SlurmJob
    from danaus.spmd import SPMDActor

    script, out, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    job = SlurmJob({"hosts": 2}, python_exe=sys.executable, port=port, log_dir=sys.argv[4])
    try:
        procs = job.state(cached_path=None).hosts.spawn_procs(per_host={"gpus": 2})
        actors = procs.spawn("spmd", SPMDActor)
        addr, master_port = actors.slice(hosts=0, gpus=0).get_host_port.call_one(None).get()
        print(addr, flush=True)
        actors.main.call(addr, master_port, [script, out]).get(timeout=200)
        procs.stop().get(timeout=60)
    finally:
        job.kill()
"""


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_the_same_script_on_a_two_node_slurm_allocation_ends_with_torchruns_weights(
    slurm: Slurm, scripts: Scripts, torchrun_weights: dict[str, Any]
) -> None:
    scripts.env = {"OMP_NUM_THREADS": "1"}  # the job's environment is the client's
    path = scripts.write(ON_SLURM)
    out = scripts.tmp_path / "slurm.pt"
    args = [str(EXAMPLES / "ddp_train.py"), str(out), str(free_port()), str(scripts.tmp_path)]
    client = scripts.start_path(path, *args)
    stdout, err = client.communicate(timeout=220)
    assert client.returncode == 0, err
    # The procs' own output reaches the client too, each line prefixed ([spmd {...}] ...).
    mine = [line for line in stdout.splitlines() if not line.startswith("[")]
    assert mine == [slurm.nodes["danaus1"].ip]  # the master: rank 0's node
    assert any(line.startswith("[spmd {hosts=") for line in stdout.splitlines())
    _assert_same_weights(out, torchrun_weights)


ELASTIC_ENV = """
    import json, os
    from danaus.actor import Actor, endpoint
    from danaus.job import ProcessJob
    from danaus.spmd import setup_torch_elastic_env

    NAMES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
             "MASTER_ADDR", "MASTER_PORT"]

    class Env(Actor):  # another actor of the same procs: it sees the process's environment
        @endpoint
        def env(self):
            return {name: os.environ.get(name) for name in NAMES}

    job = ProcessJob({"hosts": 2})
    try:
        procs = job.state(cached_path=None).hosts.spawn_procs(per_host={"gpus": 2})
        setup_torch_elastic_env(procs)
        first = list(procs.spawn("env", Env).env.call().get(timeout=30).values())
        setup_torch_elastic_env(procs, master_addr="10.1.2.3", master_port=4567)
        again = list(procs.spawn("env2", Env).env.call().get(timeout=30).values())
        print(json.dumps({"first": first, "again": again}), flush=True)
    finally:
        job.kill()
"""


def test_setup_torch_elastic_env_gives_every_proc_torchruns_eleven_variables(
    scripts: Scripts,
) -> None:
    out = scripts.run(ELASTIC_ENV)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    first = result["first"]
    assert [e["RANK"] for e in first] == ["0", "1", "2", "3"]  # hosts x gpus, row major
    assert [e["LOCAL_RANK"] for e in first] == ["0", "1", "0", "1"]
    assert [e["GROUP_RANK"] for e in first] == ["0", "0", "1", "1"]
    assert [e["ROLE_RANK"] for e in first] == ["0", "1", "2", "3"]
    for e in first:
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"]) == ("4", "2", "2")
        assert (e["ROLE_WORLD_SIZE"], e["ROLE_NAME"]) == ("4", "default")
    # Without a master given: the first proc's address and a free port, the same for all.
    masters = {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in first}
    assert len(masters) == 1
    addr, port = masters.pop()
    assert addr == "127.0.0.1" and 0 < int(port) < 65536
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in result["again"]} == {("10.1.2.3", "4567")}
