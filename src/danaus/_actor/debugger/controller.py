"""``DebugController``: the actor in the client that holds every paused debug session and
serves the debugger prompt (``danaus debug``, or the client's own terminal).

Procs reach it with ``get_or_spawn_controller("debug_controller", ...)`` the
first time one of their actors calls ``breakpoint()``; its endpoints are
concurrent, so a thousand paused actors waiting for their next line do not
queue behind each other. The prompt runs as one task on the controller's
event loop, talking to one frontend at a time: a new ``danaus debug`` takes
the prompt over from the previous one (or from the terminal), and the
terminal gets it back when that one leaves while sessions are still paused.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from typing import Any

from ... import _config as config
from ..api.actor import Actor
from ..api.controller import get_or_spawn_controller
from ..api.endpoint import concurrent_endpoint, endpoint
from ..core.context import context
from . import commands as cmds
from .frontends import (
    MAX_LINE,
    Frontend,
    FrontendClosed,
    SocketFrontend,
    TerminalFrontend,
    same_user,
)
from .session import CONTROLLER_NAME, OutputRing, SessionInfo

__all__ = ["INFO_NAME", "SOCKET_NAME", "DebugController", "Session", "debug_controller"]

SOCKET_NAME = "debug.sock"  # in the client's job directory
INFO_NAME = "debug.json"  # beside it: {"pid", "argv", "socket"}, for `danaus debug` to find it
PROMPT = "danaus_dbg> "
MARKER_ROOM = 4096  # characters: the proc's "... dropped" line fits above its bound
_CONTINUES = {"c", "cont", "continue", "q", "quit", "exit"}

BANNER = """
************************ DANAUS DEBUGGER ************************
Enter 'help' for a list of commands.
Enter 'list' to show all active breakpoints.

"""


class Session:
    """One paused actor, as the controller sees it."""

    def __init__(self, info: SessionInfo) -> None:
        self.info = info
        self.where = info.where
        # pdb output since the last line sent to it: what one read brought, which the
        # proc already bounded (room for its marker line on top), so this is a safety net.
        self.output = OutputRing(config.get("debug_output_max") + MARKER_ROOM)
        self.reply: asyncio.Future[str] | None = None  # set while its pdb waits for a line
        self.ended: str | None = None  # why it is over

    @property
    def label(self) -> str:
        return f"{self.info.name} {self.info.rank} ({self.info.host}, pid {self.info.pid})"

    @property
    def waiting(self) -> bool:
        return self.reply is not None and not self.reply.done()

    def send(self, line: str) -> bool:
        """Give the paused pdb its next line; False if it was not waiting for one."""
        if self.reply is None or self.reply.done():
            return False
        self.reply.set_result(line + "\n")
        self.reply = None
        self.output.clear()
        return True


class DebugController(Actor):
    """Collects the debug sessions of paused actors and serves the prompt that drives them."""

    def __init__(self) -> None:
        self._sessions: dict[tuple[str, int], Session] = {}
        self._event = asyncio.Event()
        self._frontend: Frontend | None = None
        self._repl: asyncio.Task[None] | None = None
        self._clients: set[asyncio.Task[Any]] = set()  # one per `danaus debug` connection
        self._closing = False  # the controller stops: the prompt goes and does not come back
        self._announced = False
        self._loop = asyncio.get_running_loop()
        # Its own node's runtime (the client's: it is spawned there), from its context.
        rt = self._rt = context().actor_instance._home().runtime
        self.socket_path = os.path.join(rt.job_dir, SOCKET_NAME)
        self._info_path = os.path.join(rt.job_dir, INFO_NAME)
        self._server: asyncio.AbstractServer | None = None
        self._serving = self._loop.create_task(self._serve())
        rt.peers.lost_callbacks.append(self._on_lost)

    def _on_lost(self, proc: str, reason: str) -> None:
        """A proc was lost (I/O thread): drop its sessions on the controller's loop."""
        if not self._sessions:
            return
        try:
            self._loop.call_soon_threadsafe(self._proc_lost, proc, reason)
        except RuntimeError:  # the controller has stopped (the program is exiting)
            pass

    # -- endpoints the paused procs call ---------------------------------------------

    @concurrent_endpoint
    async def start(self, info: SessionInfo) -> None:
        """A session begins: an actor paused in ``breakpoint()``."""
        await self._serving  # the prompt can be reached before anyone waits on it
        first = not self._sessions
        self._sessions[info.key] = Session(info)
        self._changed()
        if first and self._frontend is None:
            self._announce(info)
            self._maybe_terminal()

    @concurrent_endpoint
    async def read(self, key: tuple[str, int], output: str, where: tuple[str, int, str]) -> str:
        """The session's pdb shows ``output`` and waits for its next line."""
        s = self._sessions.get(key)
        if s is None:
            raise RuntimeError(f"no debug session for actor {key[0]} rank {key[1]}")
        s.output.append(output)
        s.where = where
        s.reply = self._loop.create_future()
        reply = s.reply
        self._changed()
        return await reply

    @concurrent_endpoint
    async def end(self, key: tuple[str, int], output: str) -> None:
        """The session is over (its endpoint returned or raised)."""
        s = self._sessions.pop(key, None)
        if s is not None:
            s.output.append(output)
            s.ended = "its endpoint finished"
            self._changed()

    @concurrent_endpoint
    async def source(self, filename: str) -> str | None:
        """The text of a source file of the client's program (a proc on another host lacks it).

        Only files of modules the client has loaded (its ``__main__`` included) are served.
        """
        known = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
        if filename not in known:
            return None
        try:
            with open(filename, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError):
            return None

    @endpoint
    async def sessions(self) -> list[dict[str, Any]]:
        """The paused sessions: actor, mesh id, rank, coords, host, pid, file, line, function."""
        return [_row(s) for s in self._sorted()]

    # -- the prompt's socket -----------------------------------------------------------

    async def _serve(self) -> None:
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        self._server = await asyncio.start_unix_server(
            self._on_client, path=self.socket_path, limit=MAX_LINE
        )
        os.chmod(self.socket_path, 0o600)
        info = {"pid": os.getpid(), "argv": sys.argv, "socket": self.socket_path}
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self._info_path))
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        os.replace(tmp, self._info_path)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not same_user(writer) or self._closing:
            writer.close()
            return
        me = asyncio.current_task()
        assert me is not None
        self._clients.add(me)  # ended in __cleanup__ with the rest of the controller
        try:
            task = self._take_prompt(SocketFrontend(reader, writer))
            await asyncio.wait([task])
        finally:
            self._clients.discard(me)

    def _maybe_terminal(self) -> None:
        if (
            self._frontend is None
            and self._sessions
            and config.get("debug_terminal")
            and TerminalFrontend.available()
        ):
            self._take_prompt(TerminalFrontend())

    def _take_prompt(self, fe: Frontend) -> asyncio.Task[None]:
        if self._repl is not None and not self._repl.done():
            self._repl.cancel()
        self._frontend = fe
        self._repl = self._loop.create_task(self._run_prompt(fe))
        return self._repl

    async def _run_prompt(self, fe: Frontend) -> None:
        try:
            await self._prompt(fe)
        except FrontendClosed:
            pass
        except asyncio.CancelledError:
            if self._closing:
                fe.close("the program exited; the debugger closed with it")
            else:
                fe.close("another danaus debug took over the debugger")
        finally:
            if self._frontend is fe:
                self._frontend = None
                if not isinstance(fe, TerminalFrontend) and not self._closing:
                    self._maybe_terminal()

    # -- the prompt -----------------------------------------------------------------------

    async def _prompt(self, fe: Frontend) -> None:
        await fe.write(BANNER)
        while True:
            line = await self._top_input(fe)
            if line is None:
                fe.close("no paused sessions left; the program goes on")
                return
            try:
                cmd = cmds.parse(line)
            except cmds.CommandError as e:
                await fe.write(f"error: {e}\n")
                continue
            if cmd is None:
                continue
            if isinstance(cmd, cmds.Quit):
                fe.close(f"leaving the debugger; {_count(len(self._sessions))} stay paused")
                return
            try:
                await self._run(fe, cmd)
            except (FrontendClosed, asyncio.CancelledError):
                raise
            except Exception as e:  # a bug in a command must not close the prompt
                await fe.write(f"error: {type(e).__name__}: {e}\n")

    async def _top_input(self, fe: Frontend) -> str | None:
        """The next command; None when the frontend gives the prompt up for lack of sessions."""
        if not fe.leaves_when_idle:
            return await fe.input(PROMPT)
        if not self._sessions:
            return None
        typed = self._loop.create_task(fe.input(PROMPT))
        idle = self._loop.create_task(self._wait_until(lambda: not self._sessions))
        try:
            await asyncio.wait([typed, idle], return_when=asyncio.FIRST_COMPLETED)
        finally:
            idle.cancel()
            if not typed.done():
                typed.cancel()
            await asyncio.wait([typed, idle])  # both ended, not left pending
        if typed.done() and not typed.cancelled():
            return typed.result()
        await fe.write("\n")
        return None

    async def _run(self, fe: Frontend, cmd: cmds.Command) -> None:
        if isinstance(cmd, cmds.Help):
            await fe.write(cmds.HELP)
        elif isinstance(cmd, cmds.ListSessions):
            await fe.write(self._table())
        elif isinstance(cmd, cmds.Detach):
            await fe.write("not attached to a session ('quit' leaves the debugger)\n")
        elif isinstance(cmd, cmds.Attach):
            await self._attach(fe, self._one(cmd.actor, cmd.rank))
        elif isinstance(cmd, cmds.Cast):
            chosen = self._chosen(cmd.actor, cmd.ranks)
            await self._cast(fe, chosen, cmd.command)
        elif isinstance(cmd, cmds.Continue):
            chosen = self._sorted()
            if not chosen:
                await fe.write("no paused sessions\n")
                return
            await self._cast(fe, chosen, "clear ;; c")

    async def _attach(self, fe: Frontend, s: Session) -> None:
        await fe.write(f"attached to {s.label}; 'detach' returns to the debugger prompt\n")
        shown: int | None = None  # everything of the current command's output
        while True:
            await self._wait_until(lambda: s.ended is not None or s.waiting)
            text = s.output.since(shown)
            shown = s.output.end
            if s.ended is not None:
                await fe.write(text + f"session {s.label} ended: {s.ended}\n")
                return
            head, nl, prompt = text.rpartition("\n")
            await fe.write(head + nl)
            line = await fe.input(prompt)
            if line.strip() == "detach":  # its output stays, shown again on the next attach
                await fe.write(f"detached from {s.label}; it stays paused\n")
                return
            if not s.send(line):
                await fe.write(f"session {s.label} ended: {s.ended or 'it stopped waiting'}\n")
                return
            shown = None

    async def _cast(self, fe: Frontend, chosen: list[Session], line: str) -> None:
        """Send ``line`` to each chosen session; wait a while for them to be back at a prompt."""

        async def one(s: Session) -> None:
            await self._wait_until(lambda: s.ended is not None or s.waiting)
            s.send(line)

        await asyncio.gather(*(one(s) for s in chosen))
        who = ", ".join(f"{s.info.name} {s.info.rank}" for s in chosen)
        if line.split(";;")[-1].strip().split(" ")[0] in _CONTINUES:
            await fe.write(f"sent {line!r} to {who}\n")
            return
        try:
            await asyncio.wait_for(
                self._wait_until(lambda: all(s.ended is not None or s.waiting for s in chosen)),
                config.get("debug_cast_wait"),
            )
        except asyncio.TimeoutError:
            busy = [s for s in chosen if not (s.ended is not None or s.waiting)]
            await fe.write(
                f"sent {line!r} to {who}; still running: "
                + ", ".join(f"{s.info.name} {s.info.rank}" for s in busy)
                + " (attach to see their output)\n"
            )
            return
        await fe.write(f"sent {line!r} to {who} (attach to see their output)\n")

    # -- choosing sessions ------------------------------------------------------------------

    def _of_actor(self, actor: str) -> list[Session]:
        mine = [s for s in self._sessions.values() if actor in (s.info.name, s.info.mesh_id)]
        if not mine:
            paused = sorted({s.info.name for s in self._sessions.values()})
            raise ValueError(
                f"no paused session of actor {actor!r}; "
                + (f"paused actors: {', '.join(paused)}" if paused else "no session is paused")
            )
        meshes = sorted({s.info.mesh_id for s in mine})
        if len(meshes) > 1:
            raise ValueError(
                f"{len(meshes)} actor meshes are called {actor!r}: name one by its id "
                f"({', '.join(meshes)})"
            )
        return sorted(mine, key=lambda s: s.info.rank)

    def _one(self, actor: str, rank: int) -> Session:
        mine = self._of_actor(actor)
        for s in mine:
            if s.info.rank == rank:
                return s
        ranks = ", ".join(str(s.info.rank) for s in mine)
        raise ValueError(f"actor {actor!r} has no paused session at rank {rank}; paused: {ranks}")

    def _chosen(self, actor: str, sel: cmds.RankSelection) -> list[Session]:
        mine = self._of_actor(actor)
        chosen = [s for s in mine if cmds.select(s.info.rank, s.info.coords, sel)]
        if not chosen:
            ranks = ", ".join(f"{s.info.rank} {s.info.coords}" for s in mine)
            raise ValueError(f"ranks({_show(sel)}) selects none of {actor!r}'s sessions: {ranks}")
        return chosen

    # -- bookkeeping ------------------------------------------------------------------------

    def _changed(self) -> None:
        """Wake everyone waiting on the sessions (each waiter re-checks its condition)."""
        self._event.set()
        self._event = asyncio.Event()

    async def _wait_until(self, done: Any) -> None:
        while not done():
            await self._event.wait()

    def _proc_lost(self, proc: str, reason: str) -> None:
        for key, s in list(self._sessions.items()):
            if s.info.proc == proc:
                del self._sessions[key]
                s.ended = f"its proc was lost ({reason})"
                if s.reply is not None and not s.reply.done():
                    s.reply.set_result("")  # EOF to no one; a cancel would fail this actor
        self._changed()

    def _sorted(self) -> list[Session]:
        return sorted(self._sessions.values(), key=lambda s: (s.info.name, s.info.rank))

    def _table(self) -> str:
        rows = [_row(s) for s in self._sorted()]
        if not rows:
            return "no paused sessions\n"
        cols = ["actor", "rank", "coords", "host", "function", "file:line"]
        cells = [
            [
                r["actor"],
                str(r["rank"]),
                ",".join(f"{k}={v}" for k, v in r["coords"].items()) or "-",
                r["host"],
                r["function"],
                f"{r['file']}:{r['line']}",
            ]
            for r in rows
        ]
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        lines = [fmt.format(*cols), *(fmt.format(*row) for row in cells)]
        return "\n".join(line.rstrip() for line in lines) + f"\n({_count(len(rows))} paused)\n"

    def _announce(self, info: SessionInfo) -> None:
        file, line, _ = info.where
        here = TerminalFrontend.available() and config.get("debug_terminal")
        print(
            f"danaus: actor {info.name} rank {info.rank} paused in breakpoint() at {file}:{line}; "
            f"run `danaus debug` in another terminal to debug it"
            + (" (or use the prompt below)" if here else ""),
            file=sys.stderr,
            flush=True,
        )

    async def __cleanup__(self, exc: Any) -> None:
        """End everything the controller started: its socket server, the task of each
        connection to it and the prompt's task, each awaited (none is left pending when
        the client exits), then its files."""
        self._closing = True
        rt = self._rt
        if self._on_lost in rt.peers.lost_callbacks:
            rt.peers.lost_callbacks.remove(self._on_lost)
        prompts = [t for t in (self._serving, self._repl) if t is not None]
        for t in prompts:
            t.cancel()  # the prompt's frontend says why it goes: the program exited
        # A connection's task ends once its prompt has (it is not cancelled: asyncio
        # reports a cancelled connection task as an unhandled error).
        await asyncio.gather(*prompts, *self._clients, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for path in (self._info_path, self.socket_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _row(s: Session) -> dict[str, Any]:
    file, line, function = s.where
    return {
        "actor": s.info.name,
        "mesh": s.info.mesh_id,
        "rank": s.info.rank,
        "coords": dict(s.info.coords),
        "host": s.info.host,
        "pid": s.info.pid,
        "file": file,
        "line": line,
        "function": function,
    }


def _count(n: int) -> str:
    return f"{n} session" + ("" if n == 1 else "s")


def _show(sel: cmds.RankSelection) -> str:
    if isinstance(sel, dict):
        return ", ".join(f"{k}={_show(v)}" for k, v in sel.items())
    if isinstance(sel, range):
        return f"{sel.start}:{sel.stop}:{sel.step}"
    return str(sel)


def debug_controller() -> Any:
    """The client's debug controller, an actor mesh of one, spawned on first use (blocks).

    It holds the sessions of actors paused in ``breakpoint()`` and serves the
    ``danaus debug`` prompt; ``debug_controller().sessions.call_one().get()``
    lists them (actor, rank, coords, host, pid, file, line, function).
    """
    return get_or_spawn_controller(CONTROLLER_NAME, DebugController).get()
