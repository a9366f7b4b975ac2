"""``danaus.builtins``: Monarch's remote functions for logging and random state, on a mesh."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

import danaus
import danaus.builtins.random
from danaus._runtime.logs import dirs as logdir
from danaus._runtime.logs import process as logs
from danaus._runtime.node import this_node
from danaus.actor import ProcMesh
from danaus.builtins import log_remote, set_logging_level_remote
from danaus.builtins.random import (
    get_rng_state_all_cuda_remote,
    get_rng_state_remote,
    manual_seed_all_cuda_remote,
    manual_seed_cuda_remote,
    random_seed_remote,
    seed_remote,
    set_manual_seed_remote,
    set_rng_state_all_cuda_remote,
    set_rng_state_remote,
)

from .conftest import COORDS, REPLY_TIMEOUT, torch

pytestmark = pytest.mark.torch


def test_builtins_is_reachable_from_the_top_level_and_as_modules() -> None:
    import danaus.builtins.log as log_module

    assert danaus.builtins.__name__ == "danaus.builtins"
    assert danaus.builtins.log_remote is log_module.log_remote is log_remote
    assert danaus.builtins.random.set_manual_seed_remote is set_manual_seed_remote
    assert type(log_remote).__name__ == "Remote"


def _shards(t: object) -> dict[tuple[int, int], torch.Tensor]:
    return {(h, g): danaus.inspect(t, host=h, gpu=g) for h, g in COORDS}


def test_a_manual_seed_makes_every_proc_draw_what_local_torch_draws(mesh: ProcMesh) -> None:
    with mesh.activate():
        assert set_manual_seed_remote(1234) is None  # propagate="inspect": nothing to wait for
        first = torch.rand(5)
        set_manual_seed_remote(1234)
        again = torch.rand(5)
    torch.manual_seed(1234)
    expected = torch.rand(5)
    for coord, value in _shards(first).items():
        assert torch.equal(value, expected), coord
    for coord, value in _shards(again).items():
        assert torch.equal(value, expected), coord


def test_process_idx_gives_each_proc_the_seed_xor_its_index(mesh: ProcMesh) -> None:
    with mesh.activate():
        set_manual_seed_remote(77, process_idx=mesh.rank(("host", "gpu")))
        drawn = torch.rand(4)
    for (h, g), value in _shards(drawn).items():
        torch.manual_seed(77 ^ (2 * h + g))
        assert torch.equal(value, torch.rand(4)), (h, g)
    values = list(_shards(drawn).values())
    assert not torch.equal(values[0], values[1])


def test_rng_state_round_trips_through_a_mesh_tensor(mesh: ProcMesh) -> None:
    with mesh.activate():
        set_manual_seed_remote(5)
        state = get_rng_state_remote()
        before = torch.rand(3)
        set_rng_state_remote(state)
        after = torch.rand(3)
    assert isinstance(state, danaus.Tensor)
    torch.manual_seed(5)
    local_state = torch.get_rng_state()
    assert torch.equal(danaus.inspect(state, host=1, gpu=1), local_state)
    assert list(state.shape) == list(local_state.shape) and state.dtype == torch.uint8
    for coord, value in _shards(after).items():
        assert torch.equal(value, danaus.inspect(before, host=coord[0], gpu=coord[1])), coord


@pytest.mark.parametrize("reseed", [seed_remote, random_seed_remote])
def test_seed_remote_reseeds_the_procs_and_leaves_the_client_alone(
    mesh: ProcMesh, reseed: danaus.Remote
) -> None:
    torch.manual_seed(9)
    client_state = torch.get_rng_state()
    with mesh.activate():
        set_manual_seed_remote(3)
        assert reseed() is None
        drawn = torch.rand(8)
    assert torch.equal(torch.get_rng_state(), client_state)
    torch.manual_seed(3)
    seeded = torch.rand(8)
    for coord, value in _shards(drawn).items():
        assert not torch.equal(value, seeded), coord


def _records_with(tag: str, mesh: ProcMesh) -> list[str]:
    """The lines holding ``tag`` in each proc's log file, once every proc's output is in."""
    logs.flush(this_node(), list(mesh._procs), REPLY_TIMEOUT).result(REPLY_TIMEOUT)
    rt = this_node(start=False).runtime
    assert rt is not None
    ours = {proc.name for proc in mesh._procs}  # other tests' procs may be gone, logs too
    found = []
    for p in logdir.read_procs(logdir.find_job(rt.proc_id.name)):
        if p.proc in ours:
            found += [line for line in Path(p.path).read_text().splitlines() if tag in line]
    return found


def test_log_remote_logs_on_every_proc_and_its_level_can_be_set(mesh: ProcMesh) -> None:
    tag = uuid.uuid4().hex
    with mesh.activate():
        assert log_remote("shown %s", tag) is None
        log_remote("info %s", tag, level=logging.INFO)  # the proc's handler takes INFO
        set_logging_level_remote(logging.ERROR)
        log_remote("hidden %s", tag)  # a warning, below the logger's level now
        log_remote("error %s", tag, level=logging.ERROR)
        set_logging_level_remote(logging.NOTSET)
        done = torch.zeros(())
    for h, g in COORDS:  # each proc's stream has run the calls above
        danaus.inspect(done, host=h, gpu=g)
    lines = _records_with(tag, mesh)
    assert sum(f"WARNING log_remote: shown {tag}" in line for line in lines) == 4, lines
    assert sum(f"INFO log_remote: info {tag}" in line for line in lines) == 4, lines
    assert sum(f"ERROR log_remote: error {tag}" in line for line in lines) == 4, lines
    assert not [line for line in lines if "hidden" in line]


def test_a_collective_leaves_the_stream_threads_log_lines_unprefixed(mesh: ProcMesh) -> None:
    """Building a process group calls the rendezvous store from a stream thread: the
    calls go out as the worker actor, so the thread does not make the proc's root
    context, whose name would then prefix the thread's log records."""
    tag = uuid.uuid4().hex
    with mesh.activate():
        total = torch.ones(2).reduce("gpu", "sum")
        log_remote("after %s", tag)
    for h, g in COORDS:
        assert torch.equal(danaus.inspect(total, host=h, gpu=g), torch.full((2,), 2.0))
    lines = _records_with(tag, mesh)
    assert sum(f"WARNING log_remote: after {tag}" in line for line in lines) == 4, lines


def test_log_remote_call_returns_each_procs_none(mesh: ProcMesh) -> None:
    with mesh.activate():
        values = log_remote.call("from call %s", "x").get(timeout=REPLY_TIMEOUT)
    assert list(values.values()) == [None] * 4


def test_the_cuda_functions_run_on_every_proc(mesh: ProcMesh) -> None:
    """On CPU-only procs torch defers CUDA seeding and has no GPU states: each call
    still resolves and runs on every proc (a GPU host checks the values)."""
    with mesh.activate():
        for fn, args in [
            (manual_seed_cuda_remote, (1,)),
            (manual_seed_all_cuda_remote, (2,)),
            (set_rng_state_all_cuda_remote, ([],)),
        ]:
            assert list(fn.call(*args).get(timeout=REPLY_TIMEOUT).values()) == [None] * 4
        states = get_rng_state_all_cuda_remote.call().get(timeout=REPLY_TIMEOUT)
    n = torch.cuda.device_count()  # the procs run on this host
    assert [len(s) for s in states.values()] == [n] * 4


def test_a_remote_call_without_results_that_fails_says_so_in_each_procs_output(
    mesh: ProcMesh,
) -> None:
    """``broadcast`` and ``propagate="inspect"`` leave no tensor to carry an error: the
    proc prints it (its output reaches the client), rather than dropping it."""
    from . import helpers

    tag = uuid.uuid4().hex
    fails_quietly = danaus.remote(helpers.fails_with, propagate="inspect")
    with mesh.activate():
        assert fails_quietly(tag) is None
        danaus.remote(helpers.fails_with).broadcast(tag + "-broadcast")
        done = torch.zeros(())
    for h, g in COORDS:
        danaus.inspect(done, host=h, gpu=g)
    lines = [line for line in _records_with(tag, mesh) if "has no result to carry" in line]
    assert len(lines) == 8, lines  # both calls, on each of the 4 procs
    assert all(f"ValueError: failed on purpose: {tag}" in line for line in lines), lines
