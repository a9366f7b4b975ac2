"""The actor behind ``danaus exec``: runs a command with the proc's mesh coordinates."""

from __future__ import annotations

import math
import os
import subprocess

from .._actor.api.actor import Actor
from .._actor.api.endpoint import endpoint
from .._actor.core.context import context

__all__ = ["ExecActor"]


class ExecActor(Actor):
    """Runs a command in its proc with the proc's mesh coordinates in the environment."""

    @endpoint
    def run(self, cmd: list[str], cwd: str | None) -> tuple[str, int, str, str]:
        """``(label, exit code, stdout, stderr)``; the label names the proc's coordinates."""
        point = context().actor_instance.rank  # in the whole mesh, not the call's slice
        sizes = {label: point.size(label) for label in dict(point)}
        env = dict(os.environ)
        for label, size in sizes.items():
            env[f"DANAUS_RANK_{label.upper()}"] = str(point[label])
            env[f"DANAUS_SIZE_{label.upper()}"] = str(size)
        env["DANAUS_RANK"] = str(point.rank)
        env["DANAUS_SIZE"] = str(math.prod(sizes.values()))
        label = ",".join(f"{k}={point[k]}" for k in sizes) or "0"
        if cwd is not None and not os.path.isdir(cwd):
            cwd = None  # the client's directory does not exist on that host
        try:
            out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
        except OSError as e:
            return label, 127, "", f"{cmd[0]}: {e}\n"
        return label, out.returncode, out.stdout, out.stderr
