"""``hosts_from_config``: the allocation's workers from Slurm's environment, else local ones."""

from __future__ import annotations

import json

import pytest

from danaus._job.config import expand_hostlist

from .conftest import LocalWorker, Scripts, free_port


def test_slurm_host_lists_expand_like_scontrol_show_hostnames() -> None:
    assert expand_hostlist("n[01-03,07],gpu5") == ["n01", "n02", "n03", "n07", "gpu5"]
    assert expand_hostlist("a[8-10]-ib") == ["a8-ib", "a9-ib", "a10-ib"]
    assert expand_hostlist("single") == ["single"]
    for bad in ("n[1-", "n[3-1]", "n[a-b]", "a,,b"):
        with pytest.raises(ValueError, match="malformed Slurm host list"):
            expand_hostlist(bad)


IN_ALLOCATION = """
    import json, os
    from danaus.actor import Actor, endpoint, hosts_from_config

    class Where(Actor):
        @endpoint
        def where(self):
            return os.getppid()

    hosts = hosts_from_config("MONARCH_HOSTS")
    procs = hosts.spawn_procs(per_host={"gpus": 1})
    zygotes = list(procs.spawn("where", Where).where.call().get(timeout=30).values())
    print(json.dumps({"sizes": hosts.sizes, "zygotes": zygotes}), flush=True)
    procs.stop().get(timeout=30)
"""


def test_in_a_slurm_allocation_it_attaches_to_the_nodes_workers(
    scripts: Scripts, local_workers: list[LocalWorker], job_secret: str
) -> None:
    port = free_port()
    for ip in ("127.0.0.1", "127.0.0.2"):  # two "nodes" as Slurm would name them
        local_workers.append(LocalWorker(port, job_secret, ip))
        assert local_workers[-1].line.startswith("danaus worker listening on"), local_workers[
            -1
        ].line
    path = scripts.write(IN_ALLOCATION)
    scripts.env = {
        "SLURM_JOB_NODELIST": "127.0.0.[1-2]",
        "DANAUS_WORKER_PORT": str(port),
        "DANAUS_SECRET": job_secret,
    }
    client = scripts.start_path(path)
    out, err = client.communicate(timeout=60)
    assert client.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["sizes"] == {"hosts": 2}
    assert len(set(result["zygotes"])) == 2  # one proc on each worker


def test_elsewhere_it_starts_two_local_hosts_ended_at_exit(scripts: Scripts) -> None:
    scripts.env = {"SLURM_JOB_NODELIST": "", "SLURM_NODELIST": ""}
    client = scripts.start_path(scripts.write(IN_ALLOCATION))
    out, err = client.communicate(timeout=60)
    assert client.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["sizes"] == {"hosts": 2}
