"""Run the unmodified torchrun script ``ddp_train.py`` on a danaus mesh of 2 hosts x 2 procs.

    python examples/spmd_ddp.py weights.pt

``ProcessJob`` starts two local worker hosts (swap in ``SSHJob`` or
``SlurmJob`` for real machines); every proc gets torchrun's environment from
its mesh coordinates (``RANK`` = row-major rank, ``LOCAL_RANK`` = the ``gpus``
coordinate) and runs the script with ``runpy``.
"""

from __future__ import annotations

import os
import sys

from danaus.job import ProcessJob
from danaus.spmd import SPMDActor

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_train.py")


def main() -> None:
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "weights.pt")
    job = ProcessJob({"hosts": 2})
    try:
        procs = job.state(cached_path=None).hosts.spawn_procs(per_host={"gpus": 2})
        actors = procs.spawn("spmd", SPMDActor)
        addr, port = actors.slice(hosts=0, gpus=0).get_host_port.call_one(None).get()
        actors.main.call(addr, port, [SCRIPT, out]).get(timeout=300)
        procs.stop().get(timeout=60)
        print(f"trained on {procs.sizes}; weights in {out}")
    finally:
        job.kill()


if __name__ == "__main__":
    main()
