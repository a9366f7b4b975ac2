"""``BootstrapCommand`` and ``default_bootstrap_cmd()``: procs started by a command.

By default a host forks each new proc from its zygote (a pre-imported
process). ``HostMesh.spawn_procs(bootstrap_command=cmd)`` instead runs
``cmd`` for each proc, so it can be wrapped (``env``, ``taskset``,
``numactl``, ``nsys profile``, a shell script that sets variables and then
``exec``s the rest); the command must end up running the proc entry module
that ``default_bootstrap_cmd()`` names. See ``danaus._runtime.hosting.command``
for how the proc gets its boot record across ``exec``.
"""

from __future__ import annotations

import os
import shutil
import site
import sys
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..._mesh import Extent, Point
from ..._runtime.hosting.command import ENTRY_MODULE, describe

__all__ = ["BootstrapCommand", "commands_for", "default_bootstrap_cmd"]


def _str_dict(env: Any, what: str) -> dict[str, str]:
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise TypeError(f"{what} must be a dict of str to str, got {env!r}")
    for k in env:
        if not k or "=" in k or "\0" in k:
            raise ValueError(f"{what} has an invalid variable name {k!r}")
    return dict(env)


class BootstrapCommand:
    """The command that starts a proc (Monarch's ``BootstrapCommand``).

    ``program`` is run (looked up on ``PATH`` when it has no ``/``) with
    ``[arg0 or program, *args]`` as its argv, and ``env`` merged over the
    environment the host's procs inherit. Whatever it wraps, it must end up
    running the proc entry module (``python -m danaus._runtime.hosting.entry``,
    as ``default_bootstrap_cmd()`` does) with the file descriptor named by
    ``$DANAUS_BOOT_FD`` still open. The attributes may be set; equal
    commands compare equal; it pickles.

    Raises ``TypeError`` for a ``program`` that is not a non-empty ``str``, an
    ``arg0`` neither ``str`` nor ``None``, ``args`` not a list of ``str`` or an
    ``env`` not a dict of ``str`` to ``str``.

    Example:

        cmd = default_bootstrap_cmd().with_env({"CUDA_VISIBLE_DEVICES": "3"})
        argv = ["--cpunodebind=0", cmd.program, *cmd.args]
        numa = BootstrapCommand("numactl", None, argv, cmd.env)
        procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=numa)
    """

    __slots__ = ("arg0", "args", "env", "program")

    def __init__(
        self,
        program: str,
        arg0: str | None,
        args: Sequence[str],
        env: Mapping[str, str],
    ) -> None:
        if not isinstance(program, str) or not program or "\0" in program:
            raise TypeError(
                f"program must be a non-empty str (a path or a name on PATH), got {program!r}"
            )
        if arg0 is not None and not isinstance(arg0, str):
            raise TypeError(f"arg0 must be a str or None, got {arg0!r}")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise TypeError(f"args must be a list of str, got {args!r}")
        self.program = program
        self.arg0 = arg0
        self.args = list(args)
        self.env = _str_dict(env, "env")

    def with_env(self, env: Mapping[str, str]) -> BootstrapCommand:
        """A copy with ``env`` merged over this command's environment (``env`` wins)."""
        return BootstrapCommand(
            self.program, self.arg0, self.args, {**self.env, **_str_dict(env, "with_env's env")}
        )

    def _boot(self) -> dict[str, Any]:
        """What a proc's boot record carries (plain data: the runtime layer runs it)."""
        cmd = BootstrapCommand(self.program, self.arg0, self.args, self.env)  # re-checked
        return {"program": cmd.program, "arg0": cmd.arg0, "args": cmd.args, "env": cmd.env}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BootstrapCommand):
            return NotImplemented
        return (self.program, self.arg0, self.args, self.env) == (
            other.program,
            other.arg0,
            other.args,
            other.env,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, as Monarch's

    def __reduce__(self) -> Any:
        return (BootstrapCommand, (self.program, self.arg0, list(self.args), dict(self.env)))

    def __repr__(self) -> str:
        arg0 = f", arg0={self.arg0!r}" if self.arg0 is not None else ""
        return (
            f"BootstrapCommand(program={self.program!r}{arg0}, args={self.args!r}, "
            f"env={self.env!r})"
        )


def default_bootstrap_cmd() -> BootstrapCommand:
    """The command that starts a danaus proc: this Python running the proc entry module.

    Its ``env`` holds what the proc needs to import danaus: ``PYTHONPATH`` with
    the directory danaus was imported from, unless this Python finds it anyway
    (installed in its site-packages, or already on ``$PYTHONPATH``). Customise
    it with ``with_env()`` or by wrapping it (see ``BootstrapCommand``).
    """
    env: dict[str, str] = {}
    # The directory holding the danaus package (this file is danaus/_actor/api/bootcmd.py).
    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
    current = os.environ.get("PYTHONPATH", "")
    found = {os.path.abspath(p) for p in current.split(os.pathsep) if p}
    found.update(os.path.abspath(p) for p in site.getsitepackages())
    found.update(os.path.abspath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib"))
    if root not in found:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, current) if p)
    return BootstrapCommand(sys.executable, None, ["-m", ENTRY_MODULE], env)


def commands_for(
    bootstrap_command: Any, labels: Sequence[str], sizes: Sequence[int], local: bool
) -> list[dict[str, Any]] | None:
    """The boot form of each proc's command, in mesh order (``None``: fork them).

    ``bootstrap_command`` is a ``BootstrapCommand`` for every proc or a callable
    given each proc's ``Point`` (over the hosts' and ``per_host``'s dimensions)
    that returns one. ``local``: the procs run on this host, so a program that
    is not there fails here, at once. Raises ``TypeError`` for anything else,
    ``FileNotFoundError`` for a missing local program.
    """
    if bootstrap_command is None:
        return None
    if isinstance(bootstrap_command, BootstrapCommand):
        make: Callable[[Point], Any] = lambda _: bootstrap_command  # noqa: E731
    elif callable(bootstrap_command):
        make = bootstrap_command
    else:
        raise TypeError(
            "bootstrap_command must be a BootstrapCommand or a callable taking a Point and "
            f"returning one, got {bootstrap_command!r}"
        )
    extent = Extent(list(labels), list(sizes))
    out = []
    checked: set[tuple[str, str]] = set()
    for rank in range(extent.nelements):
        cmd = make(Point(rank, extent))
        if not isinstance(cmd, BootstrapCommand):
            raise TypeError(
                f"bootstrap_command({Point(rank, extent)!r}) returned {cmd!r}, "
                "not a BootstrapCommand"
            )
        boot = cmd._boot()
        path = boot["env"].get("PATH", os.environ.get("PATH", os.defpath))
        if local and (boot["program"], path) not in checked:
            checked.add((boot["program"], path))
            if shutil.which(boot["program"], path=path) is None:
                where = "" if os.sep in boot["program"] else " on PATH"
                raise FileNotFoundError(
                    f"bootstrap command {describe(boot)!r}: its program {boot['program']!r} is "
                    f"not an executable file{where}"
                )
        out.append(boot)
    return out
