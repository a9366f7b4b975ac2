"""``danaus worker --detach``: start a worker in the background and report where it listens.

A launcher (``ssh HOST danaus worker --detach``) must return once the worker is
up, while the worker outlives the launcher's connection: the worker is forked
into a session of its own with its output in a log file, and the launcher
prints ``danaus worker listening on ADDR pid PID`` (or the log's tail if the
worker died first) and exits.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
import traceback
from collections.abc import Callable

__all__ = ["LISTENING", "run_detached"]

LISTENING = "danaus worker listening on "
LOG_TAIL = 4000  # bytes of the log shown when the worker fails to start


def _open_log(path: str) -> int:
    """The worker's log, for appending, opened so that nobody else chooses the file: a
    new one is created ``O_EXCL | O_NOFOLLOW``, mode 600; an existing one is taken only
    if it is not a symbolic link (``O_NOFOLLOW``), is a regular file of this user with
    one name (a hard link planted in a shared directory could name the user's
    ``~/.bashrc``) that no one else may write. Raises ``ValueError`` naming the file."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    try:
        try:
            return os.open(
                path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | nofollow, 0o600
            )
        except FileExistsError:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | nofollow)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(
                f"the log file {path!r} is a symbolic link: refusing to follow it (whoever "
                "can change the link chooses the file). Name the file itself"
            ) from None
        raise
    st = os.fstat(fd)
    if (
        not stat.S_ISREG(st.st_mode)
        or st.st_uid != os.getuid()
        or st.st_nlink != 1
        or st.st_mode & 0o022
    ):
        os.close(fd)
        raise ValueError(
            f"the log file {path!r} is not a file of this user's own (uid {st.st_uid}, mode "
            f"{oct(stat.S_IMODE(st.st_mode))}, {st.st_nlink} name(s)): remove it, or name a "
            "new file"
        )
    return fd


def run_detached(serve: Callable[[Callable[[str], None]], None], log_file: str | None) -> int:
    """Fork ``serve(on_listening)`` into its own session; return the launcher's exit code.

    ``log_file`` is opened here, before the fork (a refusal is the launcher's error):
    never through a symbolic link, only a regular file of this user."""
    if log_file is None:
        fd, log_file = tempfile.mkstemp(prefix="danaus-worker-", suffix=".log")  # O_EXCL, 600
    else:
        try:
            fd = _open_log(log_file)
        except (OSError, ValueError) as e:
            print(f"danaus worker: {e}", file=sys.stderr)
            return 2
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the worker
        os.close(r)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(null)
        os.close(fd)

        def listening(addr: str) -> None:
            os.write(w, f"{addr}\n".encode())
            os.close(w)
            print(f"{LISTENING}{addr}", flush=True)

        code = 0
        try:
            serve(listening)
        except (ValueError, RuntimeError, OSError) as e:
            print(f"danaus worker: {e}", file=sys.stderr, flush=True)
            code = 2
        except SystemExit:
            raise  # a proc forked by the worker's zygote, leaving normally
        except BaseException:
            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(w)
    os.close(fd)
    with os.fdopen(r, "rb") as pipe:
        line = pipe.readline().decode().strip()  # EOF: the worker died before listening
    if line:
        print(f"{LISTENING}{line} pid {pid} log {log_file}", flush=True)
        return 0
    os.waitpid(pid, 0)
    with open(log_file, "rb") as f:
        f.seek(max(0, os.path.getsize(log_file) - LOG_TAIL))
        tail = f.read().decode(errors="replace").strip()
    print(f"danaus worker: the worker exited before listening: {tail}", file=sys.stderr)
    return 1
