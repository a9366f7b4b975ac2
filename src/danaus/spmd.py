"""``danaus.spmd``: torchrun-style SPMD scripts on a mesh — Monarch's ``monarch.spmd``.

Example:

    from danaus.job import ProcessJob
    from danaus.spmd import SPMDActor

    procs = ProcessJob({"hosts": 2}).state().hosts.spawn_procs(per_host={"gpus": 2})
    actors = procs.spawn("spmd", SPMDActor)
    addr, port = actors.slice(hosts=0, gpus=0).get_host_port.call_one(None).get()
    actors.main.call(addr, port, ["train.py"]).get()   # RANK 0..3, LOCAL_RANK 0..1
"""

from __future__ import annotations

from ._job.spmd import SPMDActor as SPMDActor
from ._job.spmd import setup_torch_elastic_env as setup_torch_elastic_env
from ._job.spmd import setup_torch_elastic_env_async as setup_torch_elastic_env_async

__all__ = ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
