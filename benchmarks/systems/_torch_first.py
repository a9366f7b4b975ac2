"""Imported first by the workers of the systems: torch, when the workload asks for it.

A training script imports torch on its first lines, before the framework, and
that changes what the framework's calls cost (the interpreter then holds
~170,000 more objects for the garbage collector). A workload with
``torch=True`` (``workloads.py``) is measured that way: this module imports
torch before the worker imports the system under test. Standard library
only, like ``_common``; where torch is not installed it says so in
``STATE`` and the worker reports it, the numbers being taken without it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/, for workloads

from workloads import BY_NAME

# None: the workload does not ask; "imported"; or why torch could not be imported.
STATE: str | None = None


def _workload() -> str | None:
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == "--workload" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--workload="):
            return arg.split("=", 1)[1]
    return None


_wl = BY_NAME.get(_workload() or "")
if _wl is not None and _wl.torch:
    try:
        import torch  # noqa: F401

        STATE = "imported"
    except ImportError as e:
        STATE = f"not installed for {sys.executable}: {e}"
