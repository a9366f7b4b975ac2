"""``shell(host_mesh)``: a shell on one host of a mesh, as Monarch's ``monarch.job.shell``.

A proc on the host runs the worker's ``$SHELL`` (default ``/bin/bash``) with the
proc's rank variables (``MONARCH_RANK_<dim>``, ``DANAUS_RANK_<DIM>``, ...). The
client forwards its stdin to the shell in ordinary actor messages (``write``,
in order) and the shell's output comes back on a ``Port``.

- With a terminal on stdin, the shell is interactive (``-i``) on a
  pseudo-terminal of its own: the client's terminal is put in raw mode, window
  size changes follow (``SIGWINCH``), and Ctrl-C, Ctrl-D, job control reach the
  remote shell as bytes.
- Without one (a pipe, a file: ``echo 'hostname; exit 3' | danaus shell``), the
  shell reads its commands from stdin through pipes, with no terminal, so it
  can be scripted and tested: its stdout and stderr come back separately, and
  the end of stdin ends its input. Read from a file (``danaus shell <
  script.sh``), the whole script runs. Read from a pipe, the pipe's end is the
  writer going away: a shell still running ``_EOF_GRACE`` seconds later (a
  foreground command that does not read stdin, such as ``sleep 30``) is hung
  up, as Monarch's shell hangs up at once on end of input.

Either way the call returns the shell's exit status (``128 + N`` for signal N).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import termios
import threading
import tty
from typing import Any

from .._actor.api.actor import Actor
from .._actor.api.endpoint import endpoint
from .._actor.api.hosts import HostMesh
from .._actor.core.ports import Channel, Port
from .execute import exit_status, parse_env, rank_env

__all__ = ["ShellActor", "shell"]

_CHUNK = 16 * 1024
_GRACE = 1.0  # seconds a hung-up shell gets before SIGKILL
_EOF_GRACE = 2.0  # seconds a shell on pipes gets to finish after its input ended


def _set_window(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _window(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return size.lines, size.columns


class ShellActor(Actor):
    """Runs one shell in its proc; its output goes to the port ``start`` was given."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._input: int | None = None  # the pty's master, or the shell's stdin pipe
        self._pty = False
        self._lock = threading.Lock()

    @endpoint
    def start(
        self,
        output: Port[tuple[str, Any]],
        env: dict[str, str] | None,
        workdir: str | None,
        client_cwd: str,
        terminal: str | None,
        window: tuple[int, int] | None,
    ) -> None:
        """Start the shell: on a pseudo-terminal of type ``terminal``, or on pipes if it is
        ``None``. Sends ``("out", bytes)``, ``("err", bytes)``, then ``("exit", status)``."""
        if self._proc is not None:
            raise RuntimeError("this shell actor already runs a shell")
        _, rank_vars = rank_env()
        child_env = {**os.environ, **rank_vars, **(env or {})}
        cwd = workdir or (client_cwd if os.path.isdir(client_cwd) else None)
        shell = child_env.get("SHELL") or "/bin/bash"
        if terminal is None:
            self._proc = subprocess.Popen(
                [shell],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=child_env,
                start_new_session=True,
            )
            assert self._proc.stdin and self._proc.stdout and self._proc.stderr
            self._input = self._proc.stdin.fileno()
            outs = [("out", self._proc.stdout.fileno()), ("err", self._proc.stderr.fileno())]
        else:
            master, slave = os.openpty()
            if window is not None:
                _set_window(master, *window)
            child_env["TERM"] = terminal
            setsid = shutil.which("setsid")  # --ctty: the pty becomes the shell's terminal
            argv = [setsid, "--ctty", shell, "-i"] if setsid else [shell, "-i"]
            try:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=slave,
                    stdout=slave,
                    stderr=slave,
                    cwd=cwd,
                    env=child_env,
                    start_new_session=setsid is None,
                )
            except BaseException:
                os.close(master)
                raise
            finally:
                os.close(slave)
            self._input, self._pty = master, True
            outs = [("out", master)]
        threading.Thread(
            target=self._forward, args=(output, outs), name="danaus-shell-output", daemon=True
        ).start()

    def _forward(self, output: Port[tuple[str, Any]], outs: list[tuple[str, int]]) -> None:
        proc = self._proc
        assert proc is not None
        left = dict((fd, tag) for tag, fd in outs)
        while left:
            ready, _, _ = select.select(list(left), [], [])
            for fd in ready:
                try:
                    data = os.read(fd, _CHUNK)
                except OSError:  # EIO: the pty's last holder closed it
                    data = b""
                if data:
                    output.send((left[fd], data))
                else:
                    del left[fd]
        output.send(("exit", exit_status(proc.wait())))

    @endpoint
    def write(self, data: bytes) -> None:
        """Bytes for the shell's input (ignored once the shell is gone)."""
        with self._lock:
            fd = self._input
            if fd is None:
                return
            with contextlib.suppress(BrokenPipeError, OSError):
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]

    @endpoint
    def resize(self, rows: int, cols: int) -> None:
        if self._pty and self._input is not None:
            _set_window(self._input, rows, cols)

    @endpoint
    def end_input(self, hang_up: bool = True) -> None:
        """The client's input ended: on pipes the shell sees end of file (and finishes
        what it read, but is hung up ``_EOF_GRACE`` seconds later unless ``hang_up``
        is false, for input read from a file); on a terminal it is hung up."""
        if self._pty:
            self._hang_up()
            return
        with self._lock:
            proc = self._proc
            if proc is not None and proc.stdin is not None and not proc.stdin.closed:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
                self._input = None
        if proc is not None and hang_up:
            threading.Thread(
                target=self._hang_up_unless_done,
                args=(proc,),
                name="danaus-shell-eof",
                daemon=True,
            ).start()

    def _hang_up_unless_done(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            proc.wait(timeout=_EOF_GRACE)
        except subprocess.TimeoutExpired:
            self._hang_up()

    def _hang_up(self) -> None:
        """SIGHUP to the shell's process group, SIGKILL if it is still there after a grace."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGHUP)
        try:
            proc.wait(timeout=_GRACE)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    def __cleanup__(self, exc: Any) -> None:
        self._hang_up()
        if self._pty and self._input is not None:
            with contextlib.suppress(OSError):
                os.close(self._input)
            self._input = None


def shell(
    host_mesh_singleton: HostMesh,
    *,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
) -> int:
    """Run a shell on the one host of ``host_mesh_singleton`` with this process's stdin
    and stdout; its exit status. ``env`` is added to the shell's environment;
    ``workdir`` is where it starts (default: this directory, where the host has it).

    With a terminal on stdin the shell is interactive; otherwise it reads its commands
    from stdin (see the module's docstring). ``ValueError`` unless the mesh has exactly
    one host: slice it first (``hosts.slice(hosts=1)``).
    """
    if host_mesh_singleton.size() != 1:
        raise ValueError(
            f"shell needs a singleton HostMesh (one host), got {host_mesh_singleton!r}; "
            "slice the mesh to one host first (mesh.slice(hosts=0))"
        )
    env = parse_env(env)
    stdin_fd, stdout_fd = sys.stdin.fileno(), sys.stdout.fileno()
    stderr_fd = sys.stderr.fileno()
    interactive = os.isatty(stdin_fd)
    procs = host_mesh_singleton.spawn_procs()
    try:
        actor: Any = procs.spawn("shell", ShellActor)
        port, receiver = Channel[tuple[str, Any]].open()
        receiver._watch(procs._procs[0])  # its host or proc gone: the wait below fails
        terminal = os.environ.get("TERM", "xterm-256color") if interactive else None
        window = _window(stdin_fd) if interactive else None
        actor.start.call_one(port, env, workdir, os.getcwd(), terminal, window).get()
        sys.stdout.flush()
        with _terminal(stdin_fd, interactive, actor), _Input(stdin_fd, actor):
            while True:
                tag, value = receiver.recv().get()
                if tag == "exit":
                    return int(value)
                fd = stderr_fd if tag == "err" else stdout_fd
                view = memoryview(value)
                while view:
                    view = view[os.write(fd, view) :]
    finally:
        procs.stop().get()


@contextlib.contextmanager
def _terminal(fd: int, interactive: bool, actor: Any) -> Any:
    """Raw mode and window-size forwarding while a terminal is attached."""
    if not interactive:
        yield
        return
    saved = termios.tcgetattr(fd)
    previous = None
    if threading.current_thread() is threading.main_thread():

        def resized(signum: int, frame: Any) -> None:
            actor.resize.broadcast(*_window(fd))

        previous = signal.signal(signal.SIGWINCH, resized)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        if previous is not None:
            signal.signal(signal.SIGWINCH, previous)


class _Input:
    """Forwards ``fd`` to the shell on a thread until end of file, or until closed."""

    def __init__(self, fd: int, actor: Any) -> None:
        self._fd = fd
        self._actor = actor
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="danaus-shell-input", daemon=True)

    def __enter__(self) -> _Input:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        while True:
            ready, _, _ = select.select([self._fd, self._wake_r], [], [])
            if self._wake_r in ready:
                return
            try:
                data = os.read(self._fd, _CHUNK)
            except OSError:
                data = b""
            if not data:
                # a file's end is the script's end; a pipe's is its writer going away
                self._actor.end_input.broadcast(not stat.S_ISREG(os.fstat(self._fd).st_mode))
                return
            self._actor.write.broadcast(data)
