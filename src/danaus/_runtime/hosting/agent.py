"""The host agent: one per client per host; spawns, watches and reaps that client's procs.

Started by the client (``python -m danaus._runtime.hosting.agent``) with a lifeline
on its stdin: when the client exits, however it exits, the pipe reaches EOF
and the agent kills every proc it spawned, then exits. Message flow:

    requester --SPAWN_PROCS(requester, [(name, boot)])--> agent --Fork--> zygote --> proc
    proc      --READY(proc, error)--> requester                   (the proc itself)
    zygote    --Exited--> agent --LOST(name, reason)--> owner     (at once, from waitpid)
    anyone    --KILL_PROCS([name])--> agent                       (SIGKILL)

When a proc exits, the procs it owned are killed too (they would be orphans).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import secrets
import shutil
import signal
import sys
import traceback
from typing import TYPE_CHECKING, Any

from ..._transport.address import make_job_dir
from ..._transport.secret_env import forget_environ_secret
from ..._wire.ids import ProcId
from ..._wire.protocol import Kind, Lost, Message, Ready
from ..logs.agent import LogCapture
from ..logs.process import redirect_output
from ..messaging.runtime import STATUS_EXC, STATUS_OK, Runtime
from .command import exec_proc
from .proc import proc_main
from .zygote import Exited, Fork, Forked, PipeWriter, read_msg, zygote_loop

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..._transport.conn import Connection

__all__ = [
    "describe_exit",
    "main",
    "run_worker",
]


log = logging.getLogger("danaus.agent")


def _with_ip(proc: ProcId, ip: str) -> ProcId:
    """``proc`` with the host part of its TCP address replaced by ``ip``."""
    entries = []
    for e in proc.addr.split(";"):
        if e.startswith("tcp://"):
            port = e.rsplit(":", 1)[1]
            e = f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"
        entries.append(e)
    return ProcId(proc.name, ";".join(entries))


def describe_exit(status: int) -> str:
    """Say how a process ended, from its ``waitpid`` status."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the process was killed by {name} (signal {-code})"
    if code == 0:
        return "the process exited normally (code 0)"
    return f"the process exited with code {code}"


class Agent:
    """The agent's state, living on its runtime's I/O loop.

    A *local* agent serves the one client that started it and dies with it
    (lifeline on stdin). A *worker* agent (``danaus worker``) serves one
    attached client at a time over TCP; when that client goes away it kills
    the client's procs and waits for the next.
    """

    def __init__(
        self,
        rt: Runtime,
        req_w: int,
        resp_r: int,
        *,
        worker: bool = False,
        client: ProcId | None = None,
    ) -> None:
        self.rt = rt
        self.req_w = req_w
        self.resp_r = resp_r
        self.worker = worker
        self.client: ProcId | None = None
        self.procs: dict[str, tuple[ProcId, ProcId]] = {}  # name -> (proc, owner)
        self.pids: dict[str, int] = {}
        # Procs asked of the zygote for a client that is gone since: killed once forked
        # (the ask was sent before the client was lost; its Forked comes after).
        self.doomed: set[str] = set()
        # The local agent learns the secret on its lifeline; a worker's is its runtime's.
        self.secret: bytes | None = rt.secret
        self._lifeline = b""
        # A local agent's client is its owner; a worker's, whoever attaches.
        self.logs = LogCapture(rt, client, client.name if client is not None else None)
        rt.register(Kind.SPAWN_PROCS, self._on_spawn)
        rt.register(Kind.KILL_PROCS, self._on_kill)
        rt.register(Kind.ATTACH, self._on_attach)
        rt.register(Kind.SHUTDOWN_HOST, self._on_shutdown)
        rt.loop.add_reader(resp_r, self._on_zygote)
        self.to_zygote = PipeWriter(rt.loop, req_w, lambda: self._exit("the zygote died"))
        if worker:
            rt.peers.lost_callbacks.append(self._on_lost)
        else:
            os.set_blocking(0, False)
            rt.loop.add_reader(0, self._on_lifeline)

    def _on_attach(self, conn: Connection, msg: Message) -> None:
        client, port = msg.header
        current = self.client
        busy = current is not None and current.name != client.name
        if busy and current is not None and self.rt.peers.is_lost(current.name) is None:
            err = RuntimeError(
                f"worker {self.rt.proc_id.name} already serves client {current.name}; "
                "a worker serves one client at a time"
            )
            self.rt.reply(port, 0, STATUS_EXC, (err, ""))
            return
        if self.rt.peers.is_lost(client.name) is not None:
            self.rt.peers.forget_peer(client.name)  # the same client, back after a partition
        if conn.tcp:
            # Reach the client at the address its connection came from: that one works
            # from here, whatever the client chose to advertise.
            client = _with_ip(client, conn.sock.getpeername()[0])
            self.rt.peers.learn(client)
        self.client = client
        self.logs.set_job(client, client.name)
        local_ip = conn.sock.getsockname()[0] if conn.tcp else "127.0.0.1"
        info = {"name": self.rt.proc_id.name, "host": self.rt.host, "ip": local_ip}
        self.rt.reply(
            port, 0, STATUS_OK, info, on_fail=lambda r: log.error("attach reply lost: %s", r)
        )

    def _on_lost(self, name: str, reason: str) -> None:
        if self.client is not None and name == self.client.name:
            self.client = None
            self.logs.client_gone()
            for proc in list(self.pids):
                self._kill(proc)
            # Asked of the zygote but not forked yet (a spawn read just before the
            # client's loss): killed as its Forked comes, else it would run on, idle,
            # for the worker's lifetime (found by the fault campaign after a SIGSTOP).
            self.doomed |= set(self.procs) - set(self.pids)

    def _on_shutdown(self, conn: Connection, msg: Message) -> None:
        self._exit("the client shut the host down")

    def _on_spawn(self, conn: Connection, msg: Message) -> None:
        requester, procs = msg.header
        for proc, boot in procs:
            if self.worker:
                # The boot comes from another host: point it at this host's resources.
                local_ip = conn.sock.getsockname()[0] if conn.tcp else None
                boot = {
                    **boot,
                    "job_dir": self.rt.job_dir,
                    "agent": self.rt.proc_id,
                    "host": self.rt.host,
                    "insecure": self.rt.insecure,
                    "remote": True,  # its sys.path entries are checked before use
                    "tcp_advertise": local_ip or boot.get("tcp_advertise"),
                    "via": None,  # procs of a worker are reached directly, over TCP
                }
                client = self.client
                if client is not None:  # the address that reaches the client from here
                    for key in ("owner", "client"):
                        if boot.get(key) is not None and boot[key].name == client.name:
                            boot[key] = client
            else:
                self._on_lifeline()  # a secret the client sent before this spawn
            boot = {**boot, **self.logs.open(proc, requester, boot)}
            boot["secret"] = self.secret  # through the zygote's pipe, not a frame
            self.procs[proc.name] = (proc, requester)
            self.to_zygote.send(Fork(proc.name, boot))

    def _on_kill(self, conn: Connection, msg: Message) -> None:
        for name in msg.header.names:
            self._kill(name)

    def _kill(self, name: str) -> None:
        pid = self.pids.get(name)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _on_zygote(self) -> None:
        msg = read_msg(self.resp_r)
        if msg is None:
            self._exit("the zygote died")
            return
        if type(msg) is Forked:
            self.pids[msg.name] = msg.pid
            self.logs.forked(msg.name, msg.pid)
            if msg.name in self.doomed:
                self.doomed.discard(msg.name)
                self._kill(msg.name)
            return
        if type(msg) is not Exited:
            raise TypeError(f"the zygote sent {msg!r:.200}, neither Forked nor Exited")
        name, status = msg.name, msg.status
        self.pids.pop(name, None)
        self.doomed.discard(name)
        entry = self.procs.pop(name, None)
        if entry is None:
            return
        _, owner = entry
        # Its last lines first (LOG_TAIL, same connection as the LOST that follows).
        self.logs.exited(name, failed=os.waitstatus_to_exitcode(status) != 0)
        reason = describe_exit(status)
        self.rt.send(owner, Lost(name, f"proc {name} failed: {reason}"), on_fail=_ignore)
        for other, (_, other_owner) in list(self.procs.items()):
            if other_owner.name == name:
                self._kill(other)

    def _on_lifeline(self) -> None:
        """Lines from the client (``secret HEX``); EOF: the client is gone."""
        try:
            data = os.read(0, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._exit("the client went away")
        self._lifeline += data
        *lines, self._lifeline = self._lifeline.split(b"\n")
        for line in lines:
            verb, _, arg = line.partition(b" ")
            if verb == b"secret":
                self.secret = bytes.fromhex(arg.decode())

    def _exit(self, why: str) -> None:
        """Kill every proc, remove the job's socket directory, and exit.

        A local agent's directory is its client's job directory: removing it here
        cleans up after a client that was SIGKILLed (its lifeline closed), too.
        """
        if why not in ("the client went away", "the client shut the host down"):
            # Not an ending the client asked for: say why its procs are going.
            name = self.rt.proc_id.name
            print(f"danaus host agent {name}: {why}; ending its procs", file=sys.stderr)
            sys.stderr.flush()
        for name in list(self.pids):
            self._kill(name)
        shutil.rmtree(self.rt.job_dir, ignore_errors=True)
        os._exit(0)


def _child_main(name: str, boot: dict[str, Any]) -> int:
    redirect_output(boot)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if boot.get("command") is not None:  # spawn_procs(bootstrap_command=...)
        exec_proc(name, boot)  # never returns
    return proc_main(name, boot)


def _preload(modules: list[str]) -> None:
    """Import ``modules`` here, before the zygote is forked, so every proc starts with
    them (the ``zygote_preload`` setting adds to danaus's own). The zygote forks: a
    module that started a thread at import is named (a fork copies no thread)."""
    before = _threads()
    for mod in modules:
        try:
            importlib.import_module(mod)
        except Exception:  # a preload is an optimisation: report and go on
            traceback.print_exc()
        now = _threads()
        if now > before:
            print(
                f"danaus: preloading {mod!r} started {now - before} thread(s); procs are "
                "forked from this process, so those threads are absent in them (set "
                "OMP_NUM_THREADS=1 / OPENBLAS_NUM_THREADS=1, or leave it out of "
                "zygote_preload)",
                file=sys.stderr,
                flush=True,
            )
            before = now


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no /proc: nothing to say
        return 1


def _fork_zygote() -> tuple[int, int]:
    """Fork the zygote now, while this process has no thread: returns the agent's pipe ends."""
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    if os.fork() == 0:
        os.close(req_w)
        os.close(resp_r)
        zygote_loop(req_r, resp_w, _child_main)
        os._exit(0)  # pragma: no cover
    os.close(req_r)
    os.close(resp_w)
    return req_w, resp_r


def main(argv: list[str] | None = None) -> None:
    """The local host agent, started by a client."""
    p = argparse.ArgumentParser(prog="python -m danaus._runtime.hosting.agent")
    p.add_argument("--dir", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--owner", required=True, help="NAME=ADDR of the client")
    p.add_argument("--preload", default="")
    args = p.parse_args(argv)
    # The client starts its agent without DANAUS_SECRET (the secret comes on the
    # lifeline); should one be there anyway, neither the zygote nor procs inherit it.
    forget_environ_secret()
    _preload(list(filter(None, args.preload.split(","))))
    owner_name, _, owner_addr = args.owner.partition("=")
    req_w, resp_r = _fork_zygote()
    rt = Runtime(args.name, args.dir)
    rt.start(in_thread=False)
    Agent(rt, req_w, resp_r, client=ProcId(owner_name, owner_addr))
    rt.send(ProcId(owner_name, owner_addr), Ready(rt.proc_id, None), on_fail=_ignore)
    rt.loop.run_forever()


def run_worker(
    bind: str,
    port: int,
    *,
    secret: bytes | None,
    insecure: bool = False,
    preload: list[str],
    on_listening: Callable[[str], None] | None = None,
) -> None:
    """Serve as a worker host agent on ``bind:port`` until shut down (blocks; never returns).

    ``on_listening(address)`` is called once the TCP listener is up.
    """
    _preload(preload)
    req_w, resp_r = _fork_zygote()
    rt = Runtime("w" + secrets.token_hex(3), make_job_dir(), secret=secret, insecure=insecure)
    rt.start(in_thread=False)
    wildcard = bind in ("0.0.0.0", "::")
    advertised = rt.listen_tcp(bind, "127.0.0.1" if wildcard else bind, port)
    Agent(rt, req_w, resp_r, worker=True)
    if on_listening is not None:
        # On every interface: say so (clients reach it at any of this host's addresses;
        # the procs it spawns advertise the one each client came in on).
        shown = advertised
        if wildcard:
            shown = f"tcp://{'[::]' if bind == '::' else bind}:{advertised.rsplit(':', 1)[1]}"
        on_listening(shown)
    rt.loop.run_forever()


def _ignore(reason: str) -> None:
    pass


if __name__ == "__main__":
    main()
