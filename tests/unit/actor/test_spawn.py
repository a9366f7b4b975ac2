"""Spawning, as far as it happens in the client itself: ``this_host()`` and
``this_proc()``, actors spawned on this proc, and what ``spawn_procs`` and ``spawn``
refuse before anything is sent or started. Procs and actors spawned on them:
``tests/integration/test_spawn.py``."""

from __future__ import annotations

import os
import threading

import pytest

from danaus.actor import Actor, HostMesh, ProcMesh, endpoint, this_host, this_proc

# Bounded wait for a reply from an actor of this process: far above what one needs.
TIMEOUT = 30.0


class Pid(Actor):
    def __init__(self, tag: str = "") -> None:
        self.tag = tag

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Mixed(Actor):
    @endpoint
    def sync_one(self) -> None: ...

    @endpoint
    async def async_one(self) -> None: ...


class NotAnActor:
    pass


def test_this_host_is_a_zero_dimensional_host_mesh() -> None:
    host = this_host()
    assert isinstance(host, HostMesh)
    assert host.sizes == {}
    assert len(host) == 1
    assert host.initialized.get(timeout=TIMEOUT) is True


def test_this_host_is_real_processes_that_stream_their_logs() -> None:
    host = this_host()
    assert host.is_fake_in_process is False
    assert host.stream_logs is True  # procs forward their output by default


def test_actor_spawned_on_this_proc_runs_in_the_client_process() -> None:
    proc = this_proc()
    assert isinstance(proc, ProcMesh)
    assert len(proc) == 1
    mesh = proc.spawn("in_client", Pid)
    assert mesh.pid.call_one().get(timeout=TIMEOUT) == os.getpid()
    mesh.stop().get(timeout=TIMEOUT)


# -- refused before anything starts ------------------------------------------------


def test_spawn_procs_rejects_a_per_host_dimension_that_is_not_a_positive_int() -> None:
    with pytest.raises(ValueError):
        this_host().spawn_procs(per_host={"gpus": 0})
    with pytest.raises(TypeError):
        this_host().spawn_procs(per_host=["gpus"])  # type: ignore[arg-type]


def test_proc_bind_is_checked_before_spawning() -> None:
    with pytest.raises(ValueError, match=r"proc_bind length \(1\) must equal procs_per_host \(2\)"):
        this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=[{"cpus": "0"}])
    with pytest.raises(ValueError, match="unknown keys \\['cpu'\\]"):
        this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpu": "0"}])
    with pytest.raises(ValueError, match="not a CPU or node list"):
        this_host().spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "zero"}])


# What spawn refuses it refuses on any proc mesh, before it sends anything: on
# this_proc() here, with no proc to start.


def test_spawn_rejects_a_class_that_is_not_an_actor() -> None:
    with pytest.raises(ValueError):
        this_proc().spawn("nope", NotAnActor)  # type: ignore[type-var]


def test_class_mixing_sync_and_async_endpoints_is_rejected_at_spawn_naming_them() -> None:
    with pytest.raises(ValueError) as info:
        this_proc().spawn("mixed", Mixed)
    message = str(info.value)
    assert "sync_one" in message
    assert "async_one" in message


def test_spawn_with_unpicklable_init_argument_raises_type_error() -> None:
    with pytest.raises(TypeError):
        this_proc().spawn("bad_args", Pid, threading.Lock())  # type: ignore[arg-type]
