"""``danaus worker --detach``: start a worker in the background and report where it listens.

A launcher (``ssh HOST danaus worker --detach``) must return once the worker is
up, while the worker outlives the launcher's connection: the worker is forked
into a session of its own with its output in a log file, and the launcher
prints ``danaus worker listening on ADDR pid PID`` (or the log's tail if the
worker died first) and exits.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from collections.abc import Callable

__all__ = ["LISTENING", "run_detached"]

LISTENING = "danaus worker listening on "
LOG_TAIL = 4000  # bytes of the log shown when the worker fails to start


def run_detached(serve: Callable[[Callable[[str], None]], None], log_file: str | None) -> int:
    """Fork ``serve(on_listening)`` into its own session; return the launcher's exit code."""
    if log_file is None:
        fd, log_file = tempfile.mkstemp(prefix="danaus-worker-", suffix=".log")
        os.close(fd)
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the worker
        os.close(r)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)

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
