"""Spawning procs and actors on them: spawn_procs, spawn, initialized, bootstraps, proc_bind,
endpoint declarations. What happens in the client alone (this_host(), this_proc(), what is
refused before anything starts): ``tests/unit/actor/test_spawn.py``."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pytest

from danaus._mesh import Region, Slice
from danaus.actor import (
    Actor,
    ActorError,
    ActorMesh,
    Future,
    ProcMesh,
    SupervisionError,
    endpoint,
    this_host,
    this_proc,
)

from .conftest import REPLY_TIMEOUT


class Pid(Actor):
    def __init__(self, tag: str = "") -> None:
        self.tag = tag

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def tag_and_env(self, var: str) -> tuple[str, str | None]:
        return self.tag, os.environ.get(var)


class FifoInit(Actor):
    """``__init__`` blocks until someone writes to the FIFO at ``path``."""

    def __init__(self, path: str) -> None:
        with open(path) as f:
            self.token = f.read()

    @endpoint
    def token_seen(self) -> str:
        return self.token


class BareAndOptions(Actor):
    @endpoint
    def bare(self, x: int) -> int:
        return x + 1

    @endpoint(instrument=False)
    def with_options(self, x: int) -> int:
        return x * 2


class AsyncActor(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    async def add(self, k: int) -> int:
        self.n += k
        return self.n

    @endpoint(instrument=True)
    async def value(self) -> int:
        return self.n


class Spawner(Actor):
    """Spawns its own procs and actors from inside an endpoint."""

    @endpoint
    def spawn_and_ask(self) -> tuple[int, list[int]]:
        child_procs = this_host().spawn_procs(per_host={"workers": 2}, name="nested")
        children = child_procs.spawn("children", Pid)
        pids = [v for _, v in children.pid.call().get(timeout=REPLY_TIMEOUT)]
        child_procs.stop().get(timeout=REPLY_TIMEOUT)
        return os.getpid(), pids

    @endpoint
    def spawn_on_this_proc(self) -> tuple[int, int]:
        local = this_proc().spawn("local_child", Pid)
        return os.getpid(), local.pid.call_one().get(timeout=REPLY_TIMEOUT)


def set_bootstrap_marker() -> None:
    os.environ["DANAUS_TEST_BOOTSTRAPPED"] = f"yes:{os.getpid()}"


async def async_bootstrap() -> None:
    os.environ["DANAUS_TEST_ASYNC_BOOTSTRAPPED"] = "yes"


def failing_bootstrap() -> None:
    raise RuntimeError("bootstrap refuses to start")


def wait_for_fifo(path: str) -> None:
    with open(path) as f:
        f.read()


def _release_fifo(path: Path, token: str = "go") -> None:
    with open(path, "w") as f:  # blocks until the reader has opened it
        f.write(token)


def _unblock_fifo_reader(path: Path) -> None:
    """Best effort, never blocking: let a reader still stuck on ``path`` go (test cleanup)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no reader (ENXIO): nobody is stuck
        return
    os.close(fd)


def test_spawn_procs_gives_a_proc_mesh_with_the_per_host_dimensions(procs: ProcMesh) -> None:
    assert isinstance(procs, ProcMesh)
    assert procs.sizes == {"gpus": 2}
    assert procs.initialized.get(timeout=REPLY_TIMEOUT) is True


def test_a_proc_mesh_and_its_slices_name_their_base_ranks_as_a_region(procs: ProcMesh) -> None:
    assert procs.region == Region(["gpus"], Slice.new_row_major([2]))
    second = procs.slice(gpus=1)
    assert second.region.slice() == Slice(1, [], [])  # base rank 1 of the mesh
    assert dict(procs.region.point_of_base_rank(1)) == {"gpus": 1}
    assert this_host().region == Region([], Slice(0, [], []))


def test_spawn_procs_starts_one_os_process_per_rank(procs: ProcMesh) -> None:
    mesh = procs.spawn("pids", Pid)
    assert len(mesh) == 2
    assert mesh.sizes == {"gpus": 2}
    pids = list(mesh.pid.call().get(timeout=REPLY_TIMEOUT).values())
    assert len(set(pids)) == 2
    assert os.getpid() not in pids
    mesh.stop().get(timeout=REPLY_TIMEOUT)


def test_spawn_procs_with_several_dimensions_is_row_major() -> None:
    pm = this_host().spawn_procs(per_host={"replicas": 2, "gpus": 3}, name="grid")
    try:
        assert pm.sizes == {"replicas": 2, "gpus": 3}
        assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
        mesh = pm.spawn("grid_pids", Pid)
        values = mesh.pid.call().get(timeout=REPLY_TIMEOUT)
        assert len(set(values.values())) == 6
        assert values.item(replicas=1, gpus=2) == mesh.slice(replicas=1, gpus=2).pid.call_one().get(
            timeout=REPLY_TIMEOUT
        )
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(30)
def test_spawn_procs_and_spawn_return_before_the_procs_have_booted(tmp_path: Path) -> None:
    fifo = tmp_path / "boot.fifo"
    os.mkfifo(fifo)
    pm = this_host().spawn_procs(
        per_host={"gpus": 1}, bootstrap=lambda: wait_for_fifo(str(fifo)), name="gated"
    )
    try:
        assert isinstance(pm, ProcMesh)
        booted = pm.initialized
        assert isinstance(booted, Future)
        mesh = pm.spawn("on_gated", Pid, "t")
        assert isinstance(mesh, ActorMesh)
        reply = mesh.tag_and_env.call_one("HOME")
        # Nothing can have run yet: the bootstrap is still blocked on the FIFO.
        assert not booted.done()
        assert not mesh.initialized.done()
        with pytest.raises(TimeoutError):
            reply.get(timeout=0.2)
        _release_fifo(fifo)
        assert booted.get(timeout=REPLY_TIMEOUT) is True
        assert mesh.initialized.get(timeout=REPLY_TIMEOUT) is None
        assert reply.get(timeout=REPLY_TIMEOUT)[0] == "t"
    finally:
        _unblock_fifo_reader(fifo)
        pm.stop().get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(30)
def test_init_runs_before_any_message_from_the_spawner(procs: ProcMesh, tmp_path: Path) -> None:
    fifo = tmp_path / "init.fifo"
    os.mkfifo(fifo)
    mesh = procs.slice(gpus=0).spawn("fifo_init", FifoInit, str(fifo))
    try:
        first = mesh.token_seen.call_one()  # sent while __init__ is blocked
        assert not mesh.initialized.done()
        with pytest.raises(TimeoutError):
            first.get(timeout=0.2)
        _release_fifo(fifo, "token-from-test")
        assert first.get(timeout=REPLY_TIMEOUT) == "token-from-test"
        assert mesh.initialized.get(timeout=REPLY_TIMEOUT) is None
    finally:
        _unblock_fifo_reader(fifo)
        mesh.stop().get(timeout=REPLY_TIMEOUT)


def test_spawn_passes_positional_and_keyword_arguments_to_init(procs: ProcMesh) -> None:
    by_position = procs.spawn("tag_pos", Pid, "positional")
    by_keyword = procs.spawn("tag_kw", Pid, tag="keyword")
    assert [
        t for t, _ in by_position.tag_and_env.call("X").get(timeout=REPLY_TIMEOUT).values()
    ] == [
        "positional",
        "positional",
    ]
    assert by_keyword.slice(gpus=1).tag_and_env.call_one("X").get(timeout=REPLY_TIMEOUT)[0] == (
        "keyword"
    )
    by_position.stop().get(timeout=REPLY_TIMEOUT)
    by_keyword.stop().get(timeout=REPLY_TIMEOUT)


def test_bootstrap_runs_in_every_proc_before_actors() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=set_bootstrap_marker)
    try:
        assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
        mesh = pm.spawn("reads_env", Pid)
        values = mesh.tag_and_env.call("DANAUS_TEST_BOOTSTRAPPED").get(timeout=REPLY_TIMEOUT)
        pids = mesh.pid.call().get(timeout=REPLY_TIMEOUT)
        for (_, env), pid in zip(values.values(), pids.values(), strict=True):
            assert env == f"yes:{pid}"
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)


def test_async_bootstrap_is_awaited_before_actors() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=async_bootstrap)
    try:
        assert pm.initialized.get(timeout=REPLY_TIMEOUT) is True
        mesh = pm.spawn("reads_async_env", Pid)
        _, env = mesh.tag_and_env.call_one("DANAUS_TEST_ASYNC_BOOTSTRAPPED").get(
            timeout=REPLY_TIMEOUT
        )
        assert env == "yes"
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)


def test_bootstrap_that_raises_makes_initialized_raise_actor_error() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=failing_bootstrap)
    try:
        with pytest.raises(ActorError) as info:
            pm.initialized.get(timeout=REPLY_TIMEOUT)
        assert "bootstrap refuses to start" in str(info.value)
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)


class Affinity(Actor):
    @endpoint
    def cpus(self) -> tuple[list[int], list[int]]:
        """The CPUs of the actor's thread, and of a thread it starts now."""
        seen: list[list[int]] = []
        t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))
        t.start()
        t.join()
        return sorted(os.sched_getaffinity(0)), seen[0]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux affinity")
def test_proc_bind_pins_each_proc_and_the_threads_it_starts() -> None:
    # Monarch's spawn_procs(proc_bind=[...]): one binding per proc of a host.
    node0 = "/sys/devices/system/node/node0/cpulist"
    from danaus._runtime.hosting.binding import cpulist

    node_cpus = sorted(cpulist(Path(node0).read_text())) if Path(node0).exists() else None
    first, last = min(os.sched_getaffinity(0)), max(os.sched_getaffinity(0))
    binds: list[dict[str, str]] = [
        {"cpus": str(first)},
        {"physcpubind": f"{first}-{last}", "cpus": str(last)},
    ]
    if node_cpus is not None:
        binds.append({"cpunodebind": "0", "membind": "0"})
    pm = this_host().spawn_procs(per_host={"gpus": len(binds)}, proc_bind=binds)
    try:
        got = list(pm.spawn("affinity", Affinity).cpus.call().get(timeout=REPLY_TIMEOUT).values())
        assert got[0] == ([first], [first])
        assert got[1] == ([last], [last])  # both keys: the CPUs in both
        if node_cpus is not None:
            assert got[2] == (node_cpus, node_cpus)
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)


def test_a_cpu_in_proc_bind_that_does_not_exist_fails_the_boot() -> None:
    # Checked before spawning (malformed proc_bind): tests/unit/actor/test_spawn.py.
    pm = this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "4095"}])
    try:
        with pytest.raises(SupervisionError, match="could not be bound as proc_bind said"):
            pm.initialized.get(timeout=REPLY_TIMEOUT)
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)


def test_a_boot_error_whose_ready_came_before_the_spawner_asked_still_fails_the_mesh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Under load the proc's READY (with its boot error) can be taken before
    # spawn_procs registers for it; the error was then dropped and the mesh counted
    # as booted. Here the registration waits until the READY was taken, every time.
    from danaus._actor.api import procs as procs_module
    from danaus._runtime.node import this_node

    track = procs_module._track_boot
    rt = this_node().runtime

    def late(node, procs, cf, *rest):  # type: ignore[no-untyped-def]
        taken = threading.Event()

        def check() -> None:
            peers = [rt.peers.table.get(p.name) for p in procs]
            if all(peer is not None and not peer.pending for peer in peers):
                taken.set()
            else:
                rt.loop.call_later(0.005, check)

        rt.call_soon(check)
        assert taken.wait(REPLY_TIMEOUT), "the proc's READY never came"
        track(node, procs, cf, *rest)

    monkeypatch.setattr(procs_module, "_track_boot", late)
    pm = this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "4095"}])
    try:
        with pytest.raises(SupervisionError, match="could not be bound as proc_bind said"):
            pm.initialized.get(timeout=REPLY_TIMEOUT)
    finally:
        pm.stop().get(timeout=REPLY_TIMEOUT)


def test_endpoint_works_bare_and_with_options(procs: ProcMesh) -> None:
    mesh = procs.spawn("bare_and_options", BareAndOptions)
    assert list(mesh.bare.call(1).get(timeout=REPLY_TIMEOUT).values()) == [2, 2]
    assert list(mesh.with_options.call(3).get(timeout=REPLY_TIMEOUT).values()) == [6, 6]
    mesh.stop().get(timeout=REPLY_TIMEOUT)


def test_async_endpoints_run_and_keep_actor_state(procs: ProcMesh) -> None:
    mesh = procs.spawn("async_actor", AsyncActor)
    mesh.add.call(2).get(timeout=REPLY_TIMEOUT)
    assert list(mesh.add.call(3).get(timeout=REPLY_TIMEOUT).values()) == [5, 5]
    assert mesh.slice(gpus=0).value.call_one().get(timeout=REPLY_TIMEOUT) == 5
    mesh.stop().get(timeout=REPLY_TIMEOUT)


def test_actor_mesh_initialized_resolves_once_every_init_has_run(procs: ProcMesh) -> None:
    mesh = procs.spawn("init_done", Pid)
    assert isinstance(mesh.initialized, Future)
    assert mesh.initialized.get(timeout=REPLY_TIMEOUT) is None
    mesh.stop().get(timeout=REPLY_TIMEOUT)


@pytest.mark.timeout(45)
def test_actor_can_spawn_procs_and_actors_from_an_endpoint(procs: ProcMesh) -> None:
    spawner = procs.slice(gpus=0).spawn("spawner", Spawner)
    spawner_pid, child_pids = spawner.spawn_and_ask.call_one().get(timeout=REPLY_TIMEOUT)
    assert len(set(child_pids)) == 2
    assert spawner_pid not in child_pids
    assert os.getpid() not in child_pids
    spawner.stop().get(timeout=REPLY_TIMEOUT)


def test_this_proc_inside_an_actor_is_that_actors_own_proc(procs: ProcMesh) -> None:
    spawner = procs.slice(gpus=1).spawn("local_spawner", Spawner)
    actor_pid, child_pid = spawner.spawn_on_this_proc.call_one().get(timeout=REPLY_TIMEOUT)
    assert child_pid == actor_pid
    assert actor_pid != os.getpid()
    spawner.stop().get(timeout=REPLY_TIMEOUT)


# -- first imports while several actors are spawned at once -------------------------

_SLOW_PACKAGE = {
    "__init__.py": """
import time

time.sleep(0.3)  # a slow first import, as torch's is; the race needs no more than that
from danaus.actor import Actor, endpoint

HELPER = 41
from . import sub


class Top(Actor):
    @endpoint
    def value(self) -> int:
        return sub.VALUE
""",
    "sub.py": """
from danaus.actor import Actor, endpoint

from {pkg} import HELPER  # like torch's submodules, it needs its parent initialised

VALUE = HELPER + 1


class Sub(Actor):
    @endpoint
    def value(self) -> int:
        return VALUE
""",
}

_TORCH_MODULES = {
    "top.py": """
import torch

from danaus.actor import Actor, endpoint


class Top(Actor):
    def __init__(self) -> None:
        self.t = torch.ones(3)

    @endpoint
    def value(self) -> float:
        return float(self.t.sum())
""",
    "sub.py": """
import torch.nn.functional as F
from torch import tensor

from danaus.actor import Actor, endpoint


class Sub(Actor):
    @endpoint
    def value(self) -> float:
        return float(F.relu(tensor([-1.0, 3.0])).sum())
""",
}


def _write_package(root: Path, files: dict[str, str]) -> str:
    pkg = f"compat_imports_{uuid.uuid4().hex}"  # never imported before, here or in a proc
    (root / pkg).mkdir()
    for name, text in files.items():
        (root / pkg / name).write_text(text.format(pkg=pkg))
    return pkg


@pytest.fixture
def importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(
    "files",
    [
        pytest.param(_SLOW_PACKAGE, id="slow_package"),
        pytest.param(_TORCH_MODULES, id="torch", marks=pytest.mark.torch),
    ],
)
def test_actors_spawned_at_once_on_a_fresh_proc_import_their_modules_safely(
    importable: Path, files: dict[str, str]
) -> None:
    import importlib

    if "torch" in files["sub.py"]:
        pytest.importorskip("torch")
    pkg = _write_package(importable, files)
    importlib.invalidate_caches()
    top = importlib.import_module(f"{pkg}.top" if "top.py" in files else pkg)
    sub = importlib.import_module(f"{pkg}.sub")
    fresh = this_host().spawn_procs(per_host={"gpus": 1})  # nothing of pkg imported there yet
    try:
        meshes = []
        for i in range(3):  # in quick succession, so the decodes overlap
            meshes.append(fresh.spawn(f"top{i}", top.Top))
            meshes.append(fresh.spawn(f"sub{i}", sub.Sub))
        values = [m.value.call_one().get(timeout=REPLY_TIMEOUT) for m in meshes]
        assert values == [values[0], values[1]] * 3
    finally:
        fresh.stop().get(timeout=REPLY_TIMEOUT)
