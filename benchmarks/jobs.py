"""Time from ``apply()`` to a ready 2-host mesh: SSHJob and SlurmJob against workers by hand.

    .venv/bin/python benchmarks/jobs.py            # as root: starts its own sshd and Slurm

It runs ``tests/jobs/test_bench.py`` (which reuses the job tests' sshd and
Slurm fixtures: a private sshd on loopback, a two-node Slurm whose nodes are
network namespaces), prints a table and writes
``benchmarks/results/jobs-<UTC timestamp>.json``. ``DANAUS_BENCH_ROUNDS``
(default 3) sets the rounds.
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    argv = [sys.executable, "-m", "pytest", "tests/jobs/test_bench.py", "-m", "slow", "-s", "-q"]
    sys.exit(subprocess.run(argv + sys.argv[1:], cwd=ROOT).returncode)
