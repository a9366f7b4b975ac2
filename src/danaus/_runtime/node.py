"""The node: one object per process that owns what danaus holds in it.

A process's danaus is its `Node`: the runtime (I/O loop, peers,
mailboxes), the host agent it started (client only), the settings it was
started with, and one state object per subsystem (owned meshes, the root
context, ...), each created on first use by `Node.part()`. Subsystems are
installed on a new node by one bootstrap function (``danaus._bootstrap``, which
lives above every layer: the package registers it in ``danaus._boothook`` and the
node asks for it there), explicitly and in a fixed order, never by import side
effects.

The client's node ends with ``shutdown_context()``; the next use starts a
fresh one, so a client can stop and start again in the same process.

There is one way to look the node up: `this_node()`. Only the public face
calls it (a user's ``this_host()``, ``context()``, ``RDMABuffer(...)``, a
job's ``state()``, a command's entry point: code that holds nothing yet);
everything below it reaches the node through what it already holds: a mesh
carries the node it belongs to (`bound()` binds one unpickled here to this
process's), an actor's cell and ``Instance`` carry theirs, a frame handler
and the ``Extensions`` hooks were given theirs when the bootstrap installed
them, and what is made for a node (a dashboard, a transfer) is given it.
``docs/internals/node.md`` lists who calls it.
"""

from __future__ import annotations

import gc
import secrets
import shutil
import subprocess
import threading
from typing import Any, Literal, Protocol, TypeVar, overload

from .. import _boothook
from .. import _config as config
from .._transport.address import make_job_dir
from .._wire.ids import ProcId
from .messaging.runtime import Runtime

__all__ = ["Node", "bound", "end", "freeze_heap", "preload_modules", "start", "this_node"]

T = TypeVar("T")


class Node:
    """Everything danaus holds in this process (see the module docstring)."""

    def __init__(self, runtime: Runtime, *, client: bool) -> None:
        self.runtime = runtime
        self.client = client
        self.settings = config.get_global_config()  # what this node was started with
        # Guards the parts table, the agent (agent_proc, agent_id), requested and shutting_down.
        self.lock = threading.RLock()
        # The host agent this client started (None in procs: theirs is in runtime.boot).
        self.agent_proc: subprocess.Popen[bytes] | None = None
        self.agent_id: ProcId | None = None
        # Procs requested from each agent, so that losing the agent fails those not yet up.
        self.requested: dict[str, list[ProcId]] = {}
        self.shutting_down = False  # shutdown_context() is stopping what it holds
        self.closed = False
        self._parts: dict[type, Any] = {}

    def part(self, cls: type[T]) -> T:
        """The state of one subsystem on this node: ``cls()``, made on first use.

        A part with an ``on_node_end()`` method has it called when the client's
        node ends (`end()`), before the runtime closes.
        """
        try:
            return self._parts[cls]  # type: ignore[no-any-return]
        except KeyError:
            with self.lock:
                if cls not in self._parts:
                    self._parts[cls] = cls()
                return self._parts[cls]  # type: ignore[no-any-return]

    def parts(self) -> dict[str, Any]:
        """Every subsystem's state, by class name (for inspection)."""
        with self.lock:
            return {cls.__qualname__: p for cls, p in self._parts.items()}

    def install(self, boot: dict[str, Any]) -> None:
        """Run the bootstrap: install every subsystem's frame handlers on the runtime."""
        _boothook.bootstrap().install(self, boot)

    def __repr__(self) -> str:
        role = "client" if self.client else "proc"
        return f"<Node {role} {self.runtime.proc_id.name} parts={sorted(self.parts())}>"


def preload_modules() -> tuple[str, ...]:
    """What a zygote imports before it forks procs: the bootstrap, its ``PRELOAD``, and
    the modules the ``zygote_preload`` setting names (``"torch,numpy"``)."""
    boot = _boothook.bootstrap()
    extra = [m.strip() for m in str(config.get("zygote_preload")).split(",") if m.strip()]
    return tuple(dict.fromkeys((boot.__name__, *boot.PRELOAD, *extra)))


# Held while a client node starts or ends: guards which node is this process's (_node).
_lock = threading.RLock()
_node: Node | None = None  # the process's node itself: the one home of session state


@overload
def this_node(*, start: Literal[True] = ...) -> Node: ...


@overload
def this_node(*, start: bool) -> Node | None: ...


def this_node(*, start: bool = True) -> Node | None:
    """This process's node: the one lookup, for the public face only.

    In the client, the first call starts a node (a runtime on a background
    thread); in a spawned proc the node exists before user code runs.
    ``start=False`` never starts one: None if none has started (a check at
    exit, a dashboard's look). Code that holds a mesh, an actor or a context
    uses the node that holds, not this.
    """
    node = _node  # the fast path of every call: one global read
    if node is not None or not start:
        return node
    with _lock:
        if _node is not None:
            return _node
        rt = Runtime("c" + secrets.token_hex(3), make_job_dir())
        rt.start(in_thread=True)
        node = _start(rt, client=True, boot={})
        freeze_heap()
        return node


class _Held(Protocol):
    node: Node | None


def bound(state: _Held) -> Node:
    """The node a mesh belongs to (``state``: the state its slices share): the one it was
    made on, or, for a mesh unpickled in this process (it carries none), this process's,
    looked up on first use and kept. The one lookup a value the user holds makes."""
    node = state.node
    if node is None:
        node = state.node = this_node()
    return node


# Per process, not a node part: gc.freeze() is the interpreter's, done once a process.
_frozen = False


def freeze_heap() -> None:
    """Take what is alive now out of the cyclic garbage collector's traversals (``gc_freeze``).

    CPython runs a full collection whenever the objects that survived its
    young collections reach a quarter of the older heap, and then visits every
    tracked object. A client that imported torch has ~170,000 of them (~25,000
    without): pipelining 10,000 calls promotes enough per-call objects for one
    or two full collections per batch, and visiting torch's objects there cost
    about a quarter of the client's throughput although no tensor is sent. The
    objects alive when the runtime starts are mostly modules, classes and
    functions that live as long as the process; frozen, they are no longer
    visited. Garbage is collected first so that none is frozen. Once per process.
    """
    global _frozen
    if _frozen or not gc.isenabled() or not config.get("gc_freeze"):
        return
    _frozen = True
    gc.collect()
    gc.freeze()


def start(runtime: Runtime, *, client: bool, boot: dict[str, Any]) -> Node:
    """Make ``runtime`` this process's node and install the subsystems on it."""
    return _start(runtime, client=client, boot=boot)


def _start(runtime: Runtime, *, client: bool, boot: dict[str, Any]) -> Node:
    global _node
    node = Node(runtime, client=client)
    with _lock:
        _node = node
    node.install(boot)
    return node


def lock() -> threading.RLock:
    """Held while a client node starts, so that two threads start one."""
    return _lock


def end(node: Node) -> None:
    """The client's node is over: close its runtime, remove its socket directory.

    The next use of danaus in this process starts a new node.
    """
    global _node
    with _lock:
        node.closed = True
        if _node is node:
            _node = None
    for part in list(node.parts().values()):
        on_end = getattr(part, "on_node_end", None)
        if on_end is not None:
            on_end()  # e.g. the data server stops listening
    rt = node.runtime
    done = threading.Event()

    def close() -> None:
        rt.close()

        def check(tries: int = 0) -> None:
            if rt.flushed() or tries > 200:
                rt.loop.stop()
                done.set()
            else:
                rt.loop.call_later(0.005, check, tries + 1)

        check()

    if rt.thread is not None and rt.thread.is_alive():
        rt.call_soon(close)
        done.wait(config.get("shutdown_timeout"))
        rt.thread.join(config.get("shutdown_timeout"))
        if not rt.thread.is_alive():
            rt.loop.close()
    shutil.rmtree(rt.job_dir, ignore_errors=True)
