"""Looking inside procs: statistics, traces and stack dumps, asked for by a message.

Every runtime answers four frames on its I/O thread, so a busy or blocked
actor never delays the answer:

    asker --STATS(port)-------> proc   snapshot: actors, endpoint metrics, connections
    asker --TRACE_START(port)-> proc   start recording spans; answer with this proc's clock
    asker --TRACE_STOP(port)--> proc   stop; answer with the spans recorded
    asker --STACK(port)-------> proc   py-spy dump of itself (from a helper thread), or
                                       Python's own view of its threads if py-spy cannot

The asking side (``gather``, ``mesh_stats``) is the actor API's
(``danaus._actor.api.stats``), so that ``ProcMesh.stats()`` needs nothing above it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

from ... import _config as config
from ..._runtime.messaging.metrics import Tracer
from ..._runtime.messaging.runtime import STATUS_OK, Runtime
from ..._runtime.node import Node
from ..._wire.protocol import Kind, Message
from ..core.cell import ActorCell

__all__ = [
    "dump_stacks",
    "install",
    "python_stacks",
    "recent",
    "snapshot",
    "stop_local_trace",
]


# -- the proc side (I/O thread) -------------------------------------------------------


def install(node: Node, boot: dict[str, Any]) -> None:
    """Answer STATS, TRACE_START, TRACE_STOP and STACK in ``node``'s runtime."""
    rt = node.runtime
    rt.register(Kind.STATS, lambda conn, msg: _on_stats(rt, msg))
    rt.register(Kind.TRACE_START, lambda conn, msg: _on_trace_start(rt, msg))
    rt.register(Kind.TRACE_STOP, lambda conn, msg: _on_trace_stop(rt, msg))
    rt.register(Kind.STACK, lambda conn, msg: _on_stack(rt, msg))
    rt.register(Kind.TELEMETRY, lambda conn, msg: _on_telemetry(rt, msg))


def _state(cell: ActorCell) -> str:
    if cell.failed is not None:
        return "failed"
    if cell.stopped:
        return "stopped"
    if cell.stopping:
        return "stopping"
    if cell.instance is None:
        return "starting"
    running = cell.running
    return f"running {running}()" if running is not None else "idle"


def snapshot(rt: Runtime) -> dict[str, Any]:
    """This proc's actors, their endpoint metrics and its connections, as plain data."""
    actors = []
    for (mesh_id, rank), mb in list(rt.router.mailboxes.items()):
        if not isinstance(mb, ActorCell):
            continue
        inst = mb.instance
        actors.append(
            {
                "mesh_id": mesh_id,
                "name": mb.display_name,
                "rank": rank,
                "coords": dict(zip(mb.extent.labels, _coords(rank, mb.extent.sizes), strict=True)),
                "class": type(inst).__qualname__ if inst is not None else None,
                "is_system": bool(getattr(mb.ctx_instance, "is_system", False)),
                "started": mb.started,
                "state": _state(mb),
                "failure": mb.failed,
                "received": mb.inbox.received,
                "queued": mb.inbox.queued,
                "endpoints": {m: st.snapshot() for m, st in list(mb.stats.items())},
            }
        )
    conns = [
        {
            "peer": name,
            "direction": direction,
            "tcp": c.tcp,
            "frames_sent": c.frames_sent,
            "bytes_sent": c.bytes_sent,
            "frames_recv": c.frames_recv,
            "bytes_recv": c.bytes_recv,
        }
        for name, direction, c in rt.links.connections()
    ]
    sections = {}
    for name, fn in list(rt.observing.observers.items()):
        try:
            sections[name] = fn()
        except Exception as e:  # one broken section must not hide the rest
            sections[name] = {"error": f"{type(e).__name__}: {e}"}
    return {
        "proc": rt.proc_id.name,
        "pid": os.getpid(),
        "host": rt.host,
        "hostname": socket.gethostname(),
        "client": not rt.boot,
        "name": rt.boot.get("name") if rt.boot else "client",
        "time": time.time(),
        "metrics": rt.observing.metrics,
        # messages this proc's sampler has seen: a counter the metrics table reads
        # without asking for the rings themselves
        "messages_seen": rt.observing.recent.seen if rt.observing.recent is not None else 0,
        "actors": actors,
        "connections": conns,
        "sections": sections,
    }


def _coords(rank: int, sizes: Sequence[int]) -> list[int]:
    out = []
    for size in reversed(list(sizes)):
        out.append(rank % size if size else 0)
        rank = rank // size if size else 0
    return out[::-1]


def _on_stats(rt: Runtime, msg: Message) -> None:
    rt.reply(msg.header.port, msg.header.slot, STATUS_OK, snapshot(rt))


def recent(rt: Runtime) -> dict[str, Any]:
    """This proc's rings (``Runtime.recent``) as plain data, with who it is; empty
    rings when metrics are off."""
    data = (
        rt.observing.recent.copy()
        if rt.observing.recent is not None
        else {"messages": [], "spans": [], "ended": [], "seen": 0, "size": 0}
    )
    data.setdefault("now_ns", time.perf_counter_ns())
    data.setdefault("now_s", time.time())
    data.update(proc=rt.proc_id.name, host=rt.host, pid=os.getpid())
    return data


def _on_telemetry(rt: Runtime, msg: Message) -> None:
    rt.reply(msg.header.port, msg.header.slot, STATUS_OK, recent(rt))


def _on_trace_start(rt: Runtime, msg: Message) -> None:
    if rt.tracer is None:
        rt.set_tracer(Tracer(config.get("trace_max_events")))
    clock = {"now_ns": time.perf_counter_ns(), "host": rt.host, "pid": os.getpid()}
    rt.reply(msg.header.port, msg.header.slot, STATUS_OK, clock)


def _on_trace_stop(rt: Runtime, msg: Message) -> None:
    rt.reply(msg.header.port, msg.header.slot, STATUS_OK, stop_local_trace(rt))


def stop_local_trace(rt: Runtime) -> dict[str, Any]:
    """Stop this runtime's tracer; its spans with who recorded them (empty if none ran)."""
    tracer = rt.set_tracer(None)
    data = tracer.drain() if tracer is not None else {"events": [], "threads": {}, "dropped": 0}
    data.update(
        proc=rt.proc_id.name,
        pid=os.getpid(),
        host=rt.host,
        name=rt.boot.get("name") if rt.boot else "client",
        client=not rt.boot,
    )
    return data


def _on_stack(rt: Runtime, msg: Message) -> None:
    port, slot = msg.header.port, msg.header.slot

    def run() -> None:  # py-spy takes a while: never on the I/O thread
        rt.reply(port, slot, STATUS_OK, dump_stacks())

    threading.Thread(target=run, name="danaus-stack-dump", daemon=True).start()


def _py_spy() -> str | None:
    """The py-spy to run: the pyspy_bin setting (Monarch's ``pyspy_bin``) if it names an
    executable, else the one beside the Python executable, else the one on PATH."""
    configured = config.get("pyspy_bin")
    if configured and os.path.isfile(configured) and os.access(configured, os.X_OK):
        return str(configured)
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else shutil.which("py-spy")


def dump_stacks(pid: int | None = None) -> str:
    """A py-spy dump of process ``pid`` (default: this one) as text.

    If py-spy is missing or may not attach (e.g. a kernel whose Yama
    ``ptrace_scope`` forbids it) and ``pid`` is this process, Python's own view
    of this process's threads follows a line that says why. Blocks (seconds).
    """
    me = pid is None or pid == os.getpid()
    target = os.getpid() if pid is None else pid
    exe = _py_spy()
    if exe is None:
        why = "py-spy is not installed (pip install 'danaus[dashboard]')"
    else:
        try:
            r = subprocess.run(
                [exe, "dump", "--pid", str(target)],
                capture_output=True,
                text=True,
                timeout=config.get("stack_timeout"),
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            why = f"py-spy failed: {e}"
        else:
            if r.returncode == 0:
                return r.stdout
            why = f"py-spy failed (exit code {r.returncode}): {r.stderr.strip()[-500:]}"
    if not me:
        return f"({why})"
    return f"({why}; Python's own view of the threads follows)\n\n{python_stacks()}"


def python_stacks() -> str:
    """Every thread of this process with its Python stack, innermost call last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f'Thread {ident} "{names.get(ident, "?")}"')
        out.extend(line.rstrip("\n") for line in traceback.format_stack(frame))
        out.append("")
    return "\n".join(out)
