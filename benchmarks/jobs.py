"""Jobs: ``apply()`` to a ready 2-host mesh, and ``sync_workspace`` of a 1,000-file tree.

    .venv/bin/python benchmarks/jobs.py            # as root: starts its own sshd and Slurm

It runs ``tests/jobs/test_bench.py`` (which reuses the job tests' fixtures: a
private sshd on loopback, a two-node Slurm whose nodes are network
namespaces, two namespace hosts with private workspace roots), prints two
tables and writes ``benchmarks/results/jobs-<workload>-<UTC timestamp>.json``:

- time from nothing to an initialized 2-host mesh with ``SSHJob`` and
  ``SlurmJob``, against two workers started by hand and attached (the
  baseline, in the same run, alternating);
- ``sync_workspace`` of 1,000 files (~2 KiB each) to two hosts: first
  (everything sent), unchanged (nothing sent) and one file changed, against
  a local ``shutil.copytree`` of the same tree.

``DANAUS_BENCH_ROUNDS`` (default 3) sets the rounds.
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    argv = [sys.executable, "-m", "pytest", "tests/jobs/test_bench.py", "-m", "slow", "-s", "-q"]
    sys.exit(subprocess.run(argv + sys.argv[1:], cwd=ROOT).returncode)
