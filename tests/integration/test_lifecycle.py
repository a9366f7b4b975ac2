"""Stopping: ActorMesh.stop, ProcMesh.stop, __cleanup__, async with, shutdown_context,
and no orphaned processes when the client dies. An actor of the client's own proc:
``tests/unit/actor/test_lifecycle.py``."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import pickle
import signal
from pathlib import Path
from typing import Any

import pytest

from danaus.actor import (
    Actor,
    Channel,
    Port,
    ProcMesh,
    SupervisionError,
    concurrent_endpoint,
    context,
    endpoint,
    this_host,
)

from .conftest import REPLY_TIMEOUT, pid_alive, wait_pids_gone


class Worker(Actor):
    def __init__(self, out: str = "") -> None:
        self.out = out
        self.seen: list[int] = []

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def record(self, i: int) -> None:
        self.seen.append(i)

    @endpoint
    def ping(self) -> str:
        return "pong"


class SyncCleanup(Actor):
    def __init__(self, out: str) -> None:
        self.out = out
        self.seen: list[int] = []

    @endpoint
    def record(self, i: int) -> None:
        self.seen.append(i)

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc: BaseException | None) -> None:
        path = Path(self.out) / f"sync-{os.getpid()}"
        path.write_text(json.dumps({"exc": repr(exc), "seen": self.seen}))


class AsyncCleanup(Actor):
    def __init__(self, out: str) -> None:
        self.out = out
        self.seen: list[int] = []

    @endpoint
    async def record(self, i: int) -> None:
        self.seen.append(i)

    @endpoint
    async def ping(self) -> str:
        return "pong"

    async def __cleanup__(self, exc: BaseException | None) -> None:
        await asyncio.sleep(0)
        path = Path(self.out) / f"async-{os.getpid()}"
        path.write_text(json.dumps({"exc": repr(exc), "seen": self.seen}))


class _WritesOnFinalisation:
    def __init__(self, path: str) -> None:
        self.path = path

    def __del__(self, _open: Any = open) -> None:
        # Builtins may already be torn down when module globals are finalised.
        with _open(self.path, "w") as f:
            f.write("finalised")


_keepalive: Any = None  # a module global of the proc, finalised when the interpreter exits


class Finaliser(Actor):
    @endpoint
    def arm(self, out: str) -> int:
        global _keepalive
        pid = os.getpid()
        atexit.register(_write, os.path.join(out, f"atexit-{pid}"), "atexit ran")
        _keepalive = _WritesOnFinalisation(os.path.join(out, f"del-{pid}"))
        return pid


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class SlowExit(Actor):
    """An exit handler that outlasts the proc's connections (as an exporter's last
    flush does): they close when the runtime stops, before the interpreter exits."""

    @endpoint
    def arm(self, out: str) -> int:
        pid = os.getpid()
        atexit.register(_write_late, os.path.join(out, f"late-{pid}"), 2.5)
        return pid


def _write_late(path: str, delay: float) -> None:
    import time

    time.sleep(delay)
    _write(path, "written at exit")


# What Monarch's test_actor_mesh_stop matches for a call to a stopped actor mesh
STOPPED = r"(?s)The actor .* and all its descendants have failed:.*stopped"


def _call_fails_with_supervision_error(mesh: Any, match: str | None = None) -> None:
    with pytest.raises(SupervisionError, match=match):
        mesh.ping.call().get(timeout=REPLY_TIMEOUT)


# -- ActorMesh.stop -------------------------------------------------------------------


def test_stopped_actor_mesh_refuses_later_calls_with_supervision_error(procs: ProcMesh) -> None:
    mesh = procs.spawn("to_stop", Worker)
    assert list(mesh.ping.call().get(timeout=REPLY_TIMEOUT).values()) == ["pong", "pong"]
    assert mesh.stop().get(timeout=REPLY_TIMEOUT) is None
    _call_fails_with_supervision_error(mesh, STOPPED)
    _call_fails_with_supervision_error(mesh.slice(gpus=1), STOPPED)
    # The procs are unaffected: other actors there keep working.
    other = procs.spawn("after_stop", Worker)
    assert list(other.ping.call().get(timeout=REPLY_TIMEOUT).values()) == ["pong", "pong"]
    other.stop().get(timeout=REPLY_TIMEOUT)


def test_a_copy_of_a_stopped_mesh_also_gets_supervision_error(procs: ProcMesh) -> None:
    mesh = procs.spawn("copied_then_stopped", Worker)
    copy = pickle.loads(pickle.dumps(mesh))
    mesh.stop().get(timeout=REPLY_TIMEOUT)
    _call_fails_with_supervision_error(copy, STOPPED)


def test_stopping_an_actor_mesh_twice_is_harmless(procs: ProcMesh) -> None:
    mesh = procs.spawn("stopped_twice", Worker)
    mesh.stop().get(timeout=REPLY_TIMEOUT)
    assert mesh.stop().get(timeout=REPLY_TIMEOUT) is None


@pytest.mark.parametrize("cls", [SyncCleanup, AsyncCleanup], ids=["sync", "async"])
def test_cleanup_runs_on_stop_after_the_messages_already_sent(
    procs: ProcMesh, tmp_path: Path, cls: type
) -> None:
    mesh = procs.spawn(f"cleanup_{cls.__name__}", cls, str(tmp_path))
    for i in range(50):
        mesh.record.broadcast(i)
    mesh.stop().get(timeout=REPLY_TIMEOUT)
    files = sorted(tmp_path.iterdir())
    assert len(files) == 2
    for f in files:
        report = json.loads(f.read_text())
        assert report == {"exc": "None", "seen": list(range(50))}


class FailsThenCleans(Actor):
    """Fails from an endpoint that raises in a broadcast; reports each __cleanup__ call."""

    def __init__(self, port: Port[str]) -> None:
        self.port = port

    @endpoint
    def boom(self) -> None:
        raise ValueError("kaboom")

    def __cleanup__(self, exc: BaseException | None) -> None:
        self.port.send(repr(exc))


class AsyncFailsThenCleans(Actor):
    def __init__(self, port: Port[str]) -> None:
        self.port = port

    @endpoint
    async def boom(self) -> None:
        raise ValueError("kaboom")

    async def __cleanup__(self, exc: BaseException | None) -> None:
        await asyncio.sleep(0)
        self.port.send(repr(exc))


class CleanupOwner(Actor):
    """Owns a child that fails, and handles its failure (the client hears nothing)."""

    def __init__(self, kind: str, port: Port[str]) -> None:
        cls = FailsThenCleans if kind == "sync" else AsyncFailsThenCleans
        self.child = context().actor_instance.proc.spawn("child", cls, port)
        self.failures: list[str] = []

    def __supervise__(self, failure: Any) -> bool:
        self.failures.append(str(failure))
        return True

    @endpoint
    def fail_child(self) -> None:
        self.child.boom.broadcast()

    @endpoint
    def failures_seen(self) -> int:
        return len(self.failures)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_cleanup_runs_with_the_exception_when_an_actor_fails_and_only_once(
    procs: ProcMesh, kind: str
) -> None:
    # Monarch: "called when the actor stops, normally or because of an error ... exc
    # carries the exception on an error stop". It did not run at all after a failure.
    port, cleanups = Channel.open()
    owner = procs.slice(gpus=0).spawn(f"cleanup_owner_{kind}", CleanupOwner, kind, port)
    owner.fail_child.call_one().get(timeout=REPLY_TIMEOUT)
    assert cleanups.recv().get(timeout=REPLY_TIMEOUT) == "ValueError('kaboom')"
    assert owner.failures_seen.call_one().get(timeout=REPLY_TIMEOUT) == 1
    # Stopping the owner stops the failed child too. A second cleanup would send from
    # that proc before the stop's answer on the same connection: nothing came.
    second = cleanups.recv()
    owner.stop().get(timeout=REPLY_TIMEOUT)
    assert not second.done()


class Interrupted(Actor):
    """Concurrent bodies that wait forever; each records its cancellation, then cleanup."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.started = 0
        self.all_started = asyncio.Event()

    def _log(self, line: str) -> None:
        with open(self.out / "log", "a") as f:
            f.write(line + "\n")

    @concurrent_endpoint
    async def forever(self, i: int, total: int) -> None:
        self.started += 1
        if self.started == total:
            self.all_started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # a handler that itself awaits must still finish first
            self._log(f"cancelled {i}")
            raise

    @endpoint
    async def wait_started(self) -> None:
        await self.all_started.wait()

    async def __cleanup__(self, exc: BaseException | None) -> None:
        await asyncio.sleep(0)
        self._log(f"cleanup {exc!r}")


def test_stop_cancels_concurrent_bodies_then_cleans_up_then_resolves(
    procs: ProcMesh, tmp_path: Path
) -> None:
    mesh = procs.slice(gpus=0).spawn("interrupted", Interrupted, str(tmp_path))
    for i in range(3):
        mesh.forever.broadcast(i, 3)
    mesh.wait_started.call_one().get(timeout=REPLY_TIMEOUT)
    mesh.stop().get(timeout=REPLY_TIMEOUT)
    lines = (tmp_path / "log").read_text().splitlines()
    assert sorted(lines[:3]) == ["cancelled 0", "cancelled 1", "cancelled 2"]
    assert lines[3:] == ["cleanup None"]


def test_a_call_to_a_concurrent_body_cancelled_by_stop_raises_supervision_error(
    procs: ProcMesh, tmp_path: Path
) -> None:
    mesh = procs.slice(gpus=1).spawn("interrupted_call", Interrupted, str(tmp_path))
    pending = mesh.forever.call_one(0, 1)
    mesh.wait_started.call_one().get(timeout=REPLY_TIMEOUT)
    mesh.stop().get(timeout=REPLY_TIMEOUT)
    with pytest.raises(SupervisionError, match="stopped"):
        pending.get(timeout=REPLY_TIMEOUT)
    assert (tmp_path / "log").read_text().splitlines() == ["cancelled 0", "cleanup None"]


def test_async_with_an_actor_mesh_stops_it_on_exit(procs: ProcMesh, tmp_path: Path) -> None:
    async def main() -> Any:
        async with procs.spawn("async_with_actors", AsyncCleanup, str(tmp_path)) as mesh:
            assert list((await mesh.ping.call()).values()) == ["pong", "pong"]
        return mesh

    mesh = asyncio.run(main())
    assert len(list(tmp_path.iterdir())) == 2  # both cleanups ran
    _call_fails_with_supervision_error(mesh)


# -- ProcMesh.stop ----------------------------------------------------------------------


@pytest.mark.timeout(45)
def test_proc_mesh_stop_ends_the_processes_after_a_normal_interpreter_exit(
    tmp_path: Path,
) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="finalised")
    fin = pm.spawn("finaliser", Finaliser)
    pids = list(fin.arm.call(str(tmp_path)).get(timeout=REPLY_TIMEOUT).values())
    assert all(pid_alive(p) for p in pids)
    assert pm.stop().get(timeout=REPLY_TIMEOUT) is None
    assert wait_pids_gone(pids, timeout=10) == []
    for pid in pids:
        assert (tmp_path / f"atexit-{pid}").read_text() == "atexit ran"
        assert (tmp_path / f"del-{pid}").read_text() == "finalised"


@pytest.mark.timeout(45)
def test_proc_mesh_stop_resolves_only_once_the_processes_have_ended(tmp_path: Path) -> None:
    # Not when their connections close: each proc's exit handler still runs then, and
    # a job.kill() right after stop() would cut it short (the last spans of an OTLP
    # exporter were lost so under load).
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="slow_exit")
    pids = list(pm.spawn("slow_exit", SlowExit).arm.call(str(tmp_path)).get().values())
    pm.stop().get(timeout=REPLY_TIMEOUT)
    assert [p for p in pids if pid_alive(p)] == []
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(f"late-{p}" for p in pids)


def test_proc_mesh_stop_runs_cleanup_of_its_actors(tmp_path: Path) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    sync_mesh = pm.spawn("sync_cleanup_on_proc_stop", SyncCleanup, str(tmp_path))
    async_mesh = pm.spawn("async_cleanup_on_proc_stop", AsyncCleanup, str(tmp_path))
    sync_mesh.record.broadcast(7)
    async_mesh.record.broadcast(8)
    sync_mesh.ping.call().get(timeout=REPLY_TIMEOUT)
    async_mesh.ping.call().get(timeout=REPLY_TIMEOUT)
    pm.stop().get(timeout=REPLY_TIMEOUT)
    reports = {f.name.split("-")[0]: json.loads(f.read_text()) for f in tmp_path.iterdir()}
    assert len(list(tmp_path.iterdir())) == 4
    assert reports["sync"] == {"exc": "None", "seen": [7]}
    assert reports["async"] == {"exc": "None", "seen": [8]}


def test_actors_of_a_stopped_proc_mesh_raise_supervision_error() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = pm.spawn("on_stopped_procs", Worker)
    mesh.ping.call().get(timeout=REPLY_TIMEOUT)
    pm.stop().get(timeout=REPLY_TIMEOUT)
    _call_fails_with_supervision_error(mesh)


def test_spawning_on_a_stopped_proc_mesh_raises_at_the_spawn() -> None:
    # Monarch 0.7.0 raises at spawn() (its test_actor_error awaits .initialized inside
    # the same pytest.raises, which this satisfies too)
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    pm.stop().get(timeout=REPLY_TIMEOUT)
    with pytest.raises(RuntimeError, match="`ProcMesh` has already been stopped"):
        pm.spawn("too_late", Worker)


def test_stopping_a_proc_mesh_twice_is_harmless() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    pm.stop().get(timeout=REPLY_TIMEOUT)
    assert pm.stop().get(timeout=REPLY_TIMEOUT) is None


def test_a_slice_of_a_proc_mesh_cannot_be_stopped(procs: ProcMesh) -> None:
    with pytest.raises(ValueError, match="not owned"):
        procs.slice(gpus=0).stop()


def test_stopping_one_proc_mesh_leaves_another_working(procs: ProcMesh) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    pm.spawn("short_lived", Worker).ping.call().get(timeout=REPLY_TIMEOUT)
    survivor = procs.spawn("survivor", Worker)
    pm.stop().get(timeout=REPLY_TIMEOUT)
    assert list(survivor.ping.call().get(timeout=REPLY_TIMEOUT).values()) == ["pong", "pong"]
    survivor.stop().get(timeout=REPLY_TIMEOUT)


def test_async_with_a_proc_mesh_stops_its_processes_on_exit(tmp_path: Path) -> None:
    async def main() -> list[int]:
        async with this_host().spawn_procs(per_host={"gpus": 2}) as pm:
            mesh = pm.spawn("in_async_with", SyncCleanup, str(tmp_path))
            await mesh.ping.call()
            workers = pm.spawn("pids_in_async_with", Worker)
            return list((await workers.pid.call()).values())

    pids = asyncio.run(main())
    assert wait_pids_gone(pids, timeout=10) == []
    assert len(list(tmp_path.iterdir())) == 2  # cleanups ran before the procs exited


# -- the whole client -------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_shutdown_context_is_idempotent_and_stops_everything(client_script, tmp_path: Path) -> None:
    result = client_script.run(
        f"""
        import json, os
        from danaus.actor import Actor, endpoint, shutdown_context, this_host, this_proc

        OUT = {str(tmp_path)!r}

        class P(Actor):
            @endpoint
            def pid(self):
                return os.getpid()

            def __cleanup__(self, exc):
                with open(os.path.join(OUT, f"cleanup-{{os.getpid()}}"), "w") as f:
                    f.write(repr(exc))

        procs = this_host().spawn_procs(per_host={{"gpus": 2}})
        remote = procs.spawn("remote", P)
        local = this_proc().spawn("local", P)
        pids = list(remote.pid.call().get(timeout=30).values())
        local.pid.call_one().get(timeout=30)
        first = shutdown_context().get(timeout=30)
        second = shutdown_context().get(timeout=30)
        try:
            procs.spawn("again", P)
            after = "spawned"
        except Exception as e:
            after = [type(e).__name__, isinstance(e, RuntimeError), str(e)]
        print(json.dumps({{"pids": pids, "first": first, "second": second, "after": after}}))
        """
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["first"] is None and out["second"] is None
    # The old session's meshes refuse new work, saying why (a new session may start).
    assert out["after"] != "spawned"
    assert out["after"][1] is True, out["after"]
    assert "shutdown_context()" in out["after"][2]
    assert wait_pids_gone(out["pids"], timeout=10) == []
    cleaned = sorted(f.name for f in tmp_path.iterdir() if f.name.startswith("cleanup-"))
    assert len(cleaned) == 3  # two remote actors and the one in the client
    for name in cleaned:
        assert (tmp_path / name).read_text() == "None"


@pytest.mark.timeout(90)
def test_a_new_session_sees_nothing_of_the_ended_ones_host_mesh_and_listeners(
    client_script,
) -> None:
    result = client_script.run(
        """
        import json
        from danaus.actor import Actor, endpoint, shutdown_context, this_host
        from danaus.testing import SimulatedMesh
        from danaus._runtime import node

        class Echo(Actor):
            @endpoint
            def echo(self, x):
                return x

        first_host = this_host()
        procs = first_host.spawn_procs(per_host={"gpus": 1})
        first = procs.spawn("e", Echo).echo.call_one(1).get(timeout=30)
        # An in-process mesh: the client and its procs listen on inproc:NAME.
        sim = SimulatedMesh(Echo, {"ranks": 1})
        sim_before = sim.mesh.echo.call_one(2).get(timeout=30)
        first_rt = node.this_node(start=False).runtime
        shutdown_context().get(timeout=30)

        # The next use starts a second session in this process (the simulated
        # procs of the first are still up on their thread).
        second_host = this_host()
        again = second_host.spawn_procs(per_host={"gpus": 1})
        second = again.spawn("e", Echo).echo.call_one(3).get(timeout=30)
        rt = node.this_node(start=False).runtime
        try:
            sim.mesh.echo.call_one(4).get(timeout=30)
            sim_after = "reached"
        except Exception as e:
            sim_after = type(e).__name__
        print(json.dumps({
            "values": [first, sim_before, second],
            "same_host_mesh": second_host is first_host,
            "same_as_this_host": this_host() is second_host,
            "meshes_of_second": len(second_host._state.proc_meshes),
            "sim_after": sim_after,
            "listening": [
                rt.transport.inproc.is_listening(name)
                for name in (first_rt.proc_id.name, sim.runtimes[0].proc_id.name)
            ],
            "first_released": first_rt.transport.inproc.closed,
            "shared": rt.transport is first_rt.transport,
        }))
        sim.close()
        shutdown_context().get(timeout=30)
        """
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["values"] == [1, 2, 3]
    # this_host() is the second session's own mesh, holding only what it spawned.
    assert out["same_host_mesh"] is False and out["same_as_this_host"] is True
    assert out["meshes_of_second"] == 1
    # The first session's in-process listeners (its own, its simulated procs') are gone
    # with it: the second cannot reach them.
    assert out["sim_after"] != "reached"
    assert out["listening"] == [False, False]
    assert out["first_released"] is True and out["shared"] is False


@pytest.mark.timeout(60)
def test_shutdown_context_warns_naming_a_proc_mesh_that_did_not_stop(client_script) -> None:
    """An actor's cleanup that never ends holds its proc mesh past shutdown_timeout: the
    shutdown goes on (the agent kills the procs) and a warning says which mesh and why."""
    result = client_script.run(
        """
        import json, logging, os, threading
        import danaus.config
        from danaus.actor import Actor, endpoint, shutdown_context, this_host

        records = []

        class Keep(logging.Handler):
            def emit(self, record):
                records.append([record.levelname, record.getMessage()])

        logging.getLogger("danaus").addHandler(Keep())
        danaus.config.configure(stop_proc_timeout=600, shutdown_timeout=0.5)

        class Stuck(Actor):
            @endpoint
            def pid(self):
                return os.getpid()

            def __cleanup__(self, exc):
                threading.Event().wait()  # never ends: its proc cannot stop by itself

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        pids = list(procs.spawn("stuck", Stuck).pid.call().get(timeout=30).values())
        shutdown_context().get(timeout=60)
        print(json.dumps({"pids": pids, "mesh": repr(procs), "records": records}))
        """
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    warnings = [m for level, m in out["records"] if level == "WARNING"]
    assert any(
        out["mesh"] in m and "did not stop cleanly" in m and "TimeoutError" in m for m in warnings
    ), out["records"]
    assert wait_pids_gone(out["pids"], timeout=10) == []


@pytest.mark.timeout(60)
def test_client_exiting_without_stopping_leaves_no_processes(client_script) -> None:
    result = client_script.run(
        """
        import json, os
        from danaus.actor import Actor, endpoint, this_host

        class P(Actor):
            @endpoint
            def pid(self):
                return os.getpid()

        procs = this_host().spawn_procs(per_host={"gpus": 2})
        print(json.dumps(list(procs.spawn("p", P).pid.call().get(timeout=30).values())))
        """
    )
    assert result.returncode == 0, result.stderr
    pids = json.loads(result.stdout.strip().splitlines()[-1])
    assert wait_pids_gone(pids, timeout=10) == []


@pytest.mark.timeout(60)
def test_sigkilled_client_leaves_no_orphaned_processes(client_script) -> None:
    client = client_script.start(
        """
        import json, os, sys
        from danaus.actor import Actor, endpoint, this_host

        def ppid_of(pid):
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            return int(stat[stat.rindex(")") + 2:].split()[1])

        class Probe(Actor):
            @endpoint
            def family(self):
                zygote = os.getppid()
                return {"proc": os.getpid(), "zygote": zygote, "agent": ppid_of(zygote)}

            @endpoint
            def spawn_nested(self):
                self.nested = this_host().spawn_procs(per_host={"inner": 2})
                inner = self.nested.spawn("inner", Probe)
                return [v["proc"] for v in inner.family.call().get(timeout=30).values()]

        procs = this_host().spawn_procs(per_host={"gpus": 2})
        probes = procs.spawn("probes", Probe)
        family = list(probes.family.call().get(timeout=30).values())
        nested = probes.slice(gpus=0).spawn_nested.call_one().get(timeout=30)
        print(json.dumps({"family": family, "nested": nested, "client": os.getpid()}), flush=True)
        sys.stdin.read()  # wait to be killed
        """
    )
    assert client.stdout is not None
    line = client.stdout.readline()
    assert line, client.stderr.read() if client.stderr else ""
    info = json.loads(line)
    pids = {f["proc"] for f in info["family"]} | set(info["nested"])
    agents = {f["agent"] for f in info["family"]}
    zygotes = {f["zygote"] for f in info["family"]}
    assert len(pids) == 4
    assert info["client"] not in agents | zygotes
    every = pids | agents | zygotes
    assert all(pid_alive(p) for p in every)
    client.send_signal(signal.SIGKILL)
    client.wait(timeout=10)
    assert wait_pids_gone(every, timeout=10) == []


def test_job_kill_inside_a_coroutine_does_not_block_its_event_loop(client_script) -> None:
    # issue 42: kill() waited for the meshes to stop with Future.get(), on the thread of
    # the running loop (a warning, and the loop blocked for as long as the stop took)
    result = client_script.run(
        """
        import asyncio, os
        from danaus.actor import Actor, endpoint
        from danaus.job import LocalJob

        class P(Actor):
            @endpoint
            def pid(self):
                return os.getpid()

        async def main():
            job = LocalJob(("hosts",))
            procs = job.state().hosts.spawn_procs(per_host={"gpus": 2})
            pids = list((await procs.spawn("p", P).pid.call()).values())
            job.kill()
            for _ in range(3000):  # the stops finish while the loop runs
                await asyncio.sleep(0.01)
                if not any(os.path.exists(f"/proc/{p}") for p in pids):
                    break
            alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
            print("alive after kill:", alive)

        asyncio.run(main())
        """
    )
    assert result.returncode == 0, result.stderr
    assert "alive after kill: []" in result.stdout
    assert "blocks the thread of a running asyncio event loop" not in result.stderr
