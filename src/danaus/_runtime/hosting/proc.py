"""The main function of a spawned proc, and this process's runtime.

A proc starts (forked by the zygote), builds its `Runtime` and its
`Node` (whose bootstrap installs the higher
layers' frame handlers), runs the
user's bootstrap function, tells its owner it is READY (or why it is not),
then serves frames until asked to stop. Stopping returns from ``proc_main``,
so the interpreter finalises normally.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

from ... import _config as config
from ..._transport.secret_env import SECRET_ENV, forget_environ_secret
from ..._wire import codec
from ..._wire.ids import ProcId
from ..._wire.protocol import Ready
from .. import node as _node
from ..messaging.runtime import Runtime
from . import binding

if TYPE_CHECKING:
    from collections.abc import Awaitable

__all__ = ["ProcExit", "exit_code", "path_entry_problem", "proc_main", "stop_proc"]


class ProcExit:
    """The code this proc's ``proc_main`` returns (a node part; ``stop_proc`` sets it)."""

    def __init__(self) -> None:
        self.code = 0


def exit_code(node: _node.Node) -> int:
    """The code ``node``'s proc exits with: 0 unless ``stop_proc`` said otherwise."""
    return node.part(ProcExit).code


def proc_main(name: str, boot: dict[str, Any]) -> int:
    """Run a proc until it is stopped; returns the exit code."""
    error = None
    try:  # first, while this process has one thread: every thread it starts inherits it
        binding.apply(boot.get("bind"))
    except (OSError, ValueError) as e:
        error = f"proc {name} could not be bound as proc_bind said ({boot.get('bind')}): {e}"
    os.environ.update(boot.get("env", {}))
    # User code in this proc has no business with the job secret: the runtime keeps it.
    # (Its agent forgot the variable before forking the zygote; this is for an
    # environment that still brought it, e.g. from the boot's ``env``.)
    if SECRET_ENV in os.environ:
        forget_environ_secret()
    secret = boot.pop("secret", None)
    for entry in boot.get("sys_path", ()):
        if entry not in sys.path and (not boot.get("remote") or _safe_path_entry(entry)):
            sys.path.append(entry)
    rt = Runtime(
        name,
        boot["job_dir"],
        secret=secret,
        host=boot.get("host"),
        insecure=bool(boot.get("insecure")),
        boot=boot,
    )
    rt.start(in_thread=False)
    if boot.get("tcp_advertise"):
        rt.listen_tcp(boot["tcp_advertise"], boot["tcp_advertise"])
    elif boot.get("via"):
        rt.advertise_via(boot["via"])  # on the host of a client attached through a gateway
    node = _node.start(rt, client=False, boot=boot)
    if error is None and boot.get("bootstrap") is not None:
        try:
            fn = codec.loads(boot["bootstrap"])
            result = fn()
            if inspect.isawaitable(result):
                asyncio.run(_await(result))
        except BaseException:
            error = f"the bootstrap function failed in proc {name}:\n{traceback.format_exc()}"
    if config.get("gc_freeze") and gc.isenabled():
        # What this proc inherited from the zygote and built while booting lives as
        # long as it does: out of the collector's full passes (and so of its writes
        # to those pages, which the zygote shares copy-on-write). No collection
        # first, which would cost every spawn: a fresh fork has next to no garbage.
        gc.freeze()
    owner: ProcId = boot["owner"]
    rt.send(owner, Ready(rt.proc_id, error), on_fail=lambda reason: stop_proc(node, 1))
    rt.loop.run_forever()
    return exit_code(node)


def _safe_path_entry(entry: str) -> bool:
    """Whether a ``sys.path`` entry sent by a client on another host may be used here.

    Only a directory (or zip) that exists here, belongs to this user or root and
    that no one else may write to: otherwise another local user could plant a
    module that this proc would import. ``DANAUS_TRUST_SYS_PATH=1`` on the worker
    takes every entry as it comes (the documented opt-in).
    """
    return path_entry_problem(entry) is None


def path_entry_problem(entry: str) -> str | None:
    """Why ``entry`` may not go on this proc's ``sys.path`` (see ``_safe_path_entry``),
    or ``None`` when it may: ``"it does not exist"``, ``"it belongs to uid N, ..."``
    or ``"group or others may write to it (mode 0o...)"``."""
    if config.get("trust_sys_path"):
        return None
    try:
        st = os.stat(entry)
    except (OSError, ValueError):
        return "it does not exist"
    if st.st_uid not in (0, os.getuid()):
        return f"it belongs to uid {st.st_uid}, neither this user (uid {os.getuid()}) nor root"
    if st.st_mode & 0o022:
        return f"group or others may write to it (mode {oct(st.st_mode & 0o7777)})"
    return None


async def _await(aw: Awaitable[object]) -> object:
    return await aw


def stop_proc(node: _node.Node, code: int = 0) -> None:
    """Close ``node``'s runtime once its frames are written, then leave ``proc_main``
    (I/O thread)."""
    node.part(ProcExit).code = code
    rt = node.runtime
    rt.close()

    def check(tries: int = 0) -> None:
        if rt.flushed() or tries > 200:
            rt.loop.stop()
        else:
            rt.loop.call_later(0.005, check, tries + 1)

    check()
