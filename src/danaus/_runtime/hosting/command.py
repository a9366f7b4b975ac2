"""Procs started by a command (``spawn_procs(bootstrap_command=...)``) instead of a bare fork.

The zygote forks the proc as usual (``PR_SET_PDEATHSIG`` set, stdout and
stderr already on the agent's log pipes, stdin on ``/dev/null``); then
`exec_proc()`, in that child, writes the boot record to an anonymous
in-memory file, leaves it open across ``exec`` and runs the command, with
the command's environment merged over the inherited one and
``DANAUS_BOOT_FD`` naming the file. The command may be a wrapper (``env``,
``taskset``, ``numactl``, ``nsys profile``, a shell script) as long as it
ends up running ``python -m danaus._runtime.hosting.entry`` (`main()`),
which reads the boot back from that file and becomes the proc.

The zygote's child is the process the agent watches, kills and reaps,
whatever it ``exec``s: a wrapper that ``exec``s the proc keeps that pid; one
that runs it as a child is its parent, and the proc asks the kernel to kill
it when that parent dies, so nothing is orphaned. A command that cannot be
run, or that exits before the proc is up, exits with the status (127 for a
program that cannot be run, as a shell does) and the stderr its owner's
error shows.
"""

from __future__ import annotations

import os
import pickle
import shlex
import sys
import tempfile
from typing import Any

from ..logs.process import line_buffer_output
from .proc import proc_main
from .zygote import set_pdeathsig

__all__ = ["BOOT_FD_ENV", "ENTRY_MODULE", "describe", "exec_proc", "main", "read_boot"]

BOOT_FD_ENV = "DANAUS_BOOT_FD"
ENTRY_MODULE = "danaus._runtime.hosting.entry"
_CANNOT_RUN = 127  # a shell's code for a command that cannot be run


def describe(command: dict[str, Any]) -> str:
    """The command as a shell line (``env`` first), for error messages."""
    env = [f"{k}={v}" for k, v in command.get("env", {}).items()]
    argv = [command["program"], *command.get("args", ())]
    return shlex.join([*(["env", *env] if env else []), *argv])


def exec_proc(name: str, boot: dict[str, Any]) -> None:
    """In the zygote's freshly forked child: run ``boot['command']``; never returns."""
    command = boot.pop("command")
    boot.pop("log_fifos", None)  # already this process's stdout and stderr
    try:
        fd = _boot_file(pickle.dumps((name, boot), protocol=5))
        env = {**os.environ, **command.get("env", {}), BOOT_FD_ENV: str(fd)}
        program = command["program"]
        argv = [command.get("arg0") or program, *command.get("args", ())]
        os.execvpe(program, argv, env)
    except BaseException as e:  # reported on stderr (the log's tail), then exit
        print(
            f"danaus: proc {name} cannot run its bootstrap command {describe(command)!r}: "
            f"{type(e).__name__}: {e}",
            file=sys.stderr,
            flush=True,
        )
    os._exit(_CANNOT_RUN)


def _boot_file(data: bytes) -> int:
    """An anonymous file holding ``data``, at offset 0, inherited across ``exec``.

    A file, not a pipe (a boot larger than a pipe's buffer would block the
    writer, which is the reader-to-be) nor an argument (``exec`` limits those)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("danaus-boot", 0)  # no MFD_CLOEXEC: the command inherits it
    else:  # pragma: no cover - not Linux
        with tempfile.TemporaryFile() as f:
            fd = os.dup(f.fileno())
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd


def read_boot() -> tuple[str, dict[str, Any]]:
    """The ``(name, boot)`` that `exec_proc()` left for this process; empties and
    closes the file and removes ``DANAUS_BOOT_FD`` (the proc's own children must not see
    it; a wrapper still holding the fd reads nothing).
    Raises ``RuntimeError`` when this process was not started that way."""
    raw = os.environ.pop(BOOT_FD_ENV, None)
    if raw is None or not raw.isdigit():
        raise RuntimeError(
            f"python -m {ENTRY_MODULE} starts a danaus proc from the boot record a host "
            f"agent leaves for it (${BOOT_FD_ENV}={raw!r}); it runs only as the end of a "
            "spawn_procs(bootstrap_command=...) command, not by hand"
        )
    fd = int(raw)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    except OSError as e:
        raise RuntimeError(
            f"cannot read the proc's boot record from fd {fd} (${BOOT_FD_ENV}): {e}; a "
            "bootstrap command must keep that file descriptor open for the proc it runs"
        ) from None
    finally:
        try:
            # The record holds the job's secret, and a wrapper that did not exec (a shell,
            # a profiler) still holds this fd: empty the file for every holder (a memfd is
            # one file), then close ours.
            os.ftruncate(fd, 0)
        except OSError:
            pass
        try:
            os.close(fd)
        except OSError:
            pass
    name, boot = pickle.loads(b"".join(chunks))
    return name, boot


def main() -> int:
    """The proc a bootstrap command runs: read the boot, then run it as a forked proc runs."""
    parent = os.getppid()
    set_pdeathsig()  # the process that ran this one (the zygote, or a wrapper of the command)
    name, boot = read_boot()
    if os.getppid() != parent:  # pragma: no cover - it died before the line above
        return 1
    line_buffer_output()
    return proc_main(name, boot)
