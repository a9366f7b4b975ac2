"""The task-queue model of the simulated workers: ``danaus.simulator.task``, ``tensor``,
``worker`` (Monarch's ``monarch.simulator.task``/``tensor``/``worker``, issue 42)."""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from danaus.common.fake import fake_call  # noqa: E402
from danaus.simulator import set_meta  # noqa: E402
from danaus.simulator.profiling import RuntimeEstimator, TimingType  # noqa: E402
from danaus.simulator.task import (  # noqa: E402
    Borrow,
    EventTask,
    Task,
    TaskState,
    WorkerTaskManager,
)
from danaus.simulator.tensor import (  # noqa: E402
    FakeTensorTracker,
    StreamMemoryTracker,
    TensorManager,
    WorkerStorageTracker,
)
from danaus.simulator.worker import Worker, WorkerGroup, run_until_idle, write_trace  # noqa: E402

MB = 1 << 20


def _task(
    inputs: list[int], outputs: list[int], start: int = 0, runtime: int = 10, **kw: Any
) -> Task:
    return Task(
        inputs=inputs,
        outputs=outputs,
        command_id=kw.pop("command_id", 0),
        start_time=start,
        runtime=runtime,
        meta=kw.pop("meta", ["op"]),
        **kw,
    )


def _fakes(tracker: FakeTensorTracker, sizes: dict[int, int], **kw: Any) -> dict[int, Any]:
    """Fake float32 tensors of ``sizes[id]`` elements, known to ``tracker``."""
    made = fake_call(lambda: {i: torch.empty(n) for i, n in sizes.items()})
    tracker.add(made, **kw)
    return made


def _step(*workers: Worker) -> None:
    assert run_until_idle(workers) == []


# -- tasks ---------------------------------------------------------------------------------


def test_a_task_becomes_ready_only_after_its_dependencies_and_starts_after_they_end() -> None:
    a, b = _task([], [1], start=0, runtime=5), _task([1], [2], start=2, runtime=7)
    b.dependencies.append(a)
    assert not b.maybe_set_ready() and b.state is TaskState.PENDING
    assert a.maybe_set_ready() and a.maybe_execute() and a.maybe_finish()
    assert (a.start_time, a.end_time) == (0, 5)
    assert b.maybe_set_ready() and b.start_time == 5
    assert not b.maybe_set_ready()  # already ready: no change
    assert not b.maybe_finish()  # not executing yet
    assert b.maybe_execute() and b.maybe_finish() and b.end_time == 12


def test_a_collective_ends_its_runtime_after_the_last_member_started() -> None:
    peers: list[Task] = []
    early = _task([], [], start=0, runtime=100, collectives=peers)
    late = _task([], [], start=40, runtime=100, collectives=peers)
    assert peers == [early, late]
    for t in (early, late):
        t.maybe_set_ready()
    early.maybe_execute()
    assert not early.maybe_finish()  # its peer has not started
    late.maybe_execute()
    assert early.maybe_finish() and late.maybe_finish()
    assert early.end_time == late.end_time == 140


def test_an_event_wait_ends_no_earlier_than_what_it_waits_for() -> None:
    recorded = _task([], [], start=0, runtime=50)
    wait = EventTask(recorded, 0, "main", 1, "other", start_time=3, command_id=1, runtime=1)
    assert wait.meta[:2] == ["waiting for", "main"] and wait.waits == [recorded]
    wait.maybe_set_ready() and wait.maybe_execute()
    assert not wait.maybe_finish()
    recorded.maybe_set_ready() and recorded.maybe_execute() and recorded.maybe_finish()
    assert wait.maybe_finish() and wait.end_time == 50


def test_set_meta_labels_are_appended_to_a_tasks_meta() -> None:
    with set_meta("fwd"):
        t = _task([], [], meta=["mm"])
    assert t.meta == ["mm", "fwd"] and repr(t) == "mm fwd"


def test_the_task_manager_numbers_removes_and_clones_with_links_to_the_clones() -> None:
    m = WorkerTaskManager()
    done, live = _task([], [1]), _task([1], [2])
    for t in (done, live):
        m.add(t)
    assert (done.task_id, live.task_id) == (0, 1)
    live.dependencies.append(done)
    with pytest.raises(ValueError):
        m.remove(_task([], []))  # never added
    done.maybe_set_ready() and done.maybe_execute() and done.maybe_finish()
    m.remove(done)
    with pytest.raises(KeyError):
        m.remove(done)
    waiter = _task([], [], waits=[live])
    m.add(waiter)
    c = m.clone()
    assert c.tasks.keys() == {1, 2}
    assert c.tasks[2].waits == [c.tasks[1]] and c.tasks[2].waits[0] is not live
    dep = c.tasks[1].dependencies[0]
    assert dep is not done and dep.task_id == done.task_id and dep.state is TaskState.EXECUTED
    # both number new tasks alike
    assert m.add(_task([], [])) == c.add(_task([], [])) == 3


def test_a_clone_of_a_pending_task_linked_to_a_dropped_unfinished_one_is_refused() -> None:
    m = WorkerTaskManager()
    a, b = _task([], []), _task([], [])
    m.add(a), m.add(b)
    b.dependencies.append(a)
    m.remove(a)  # wrongly: it has not executed
    with pytest.raises(RuntimeError, match="neither live nor executed"):
        m.clone()


# -- tensors and memory ----------------------------------------------------------------------


def test_storage_is_counted_once_for_views_and_not_for_borrows() -> None:
    ftt = FakeTensorTracker()
    base = _fakes(ftt, {1: MB // 4})[1]  # 1 MiB of float32
    ftt.add({2: fake_call(lambda: base.view(-1)[:10])})  # a view: same storage
    _fakes(ftt, {3: 8}, is_borrowed=True)
    st = WorkerStorageTracker(ftt)
    ev = st.incr_ref(1)
    assert ev is not None and ev.delta == MB
    assert st.incr_ref(2) is None
    assert st.incr_ref(3) is None and ftt.is_borrowed(3)
    assert st.decr_ref(1) is None  # the view still holds it
    freed = st.decr_ref(2)
    assert freed == ev
    with pytest.raises(RuntimeError):
        st.decr_ref(2)
    # a storage seen first through a borrow is counted once a tensor of its own uses it,
    # and released when its last tensor goes, borrowed or not
    ftt.add({4: fake_call(lambda: ftt.tensors[3].view(-1))})
    got = st.incr_ref(4)
    assert got is not None and got.delta == 32
    assert st.decr_ref(4) is None
    assert st.decr_ref(3) == got


def test_stream_memory_is_a_heap_of_events_in_time_order() -> None:
    ftt = FakeTensorTracker()
    _fakes(ftt, {1: 256, 2: 512})
    mem = StreamMemoryTracker(WorkerStorageTracker(ftt))
    mem.incr_ref(20, 2, None)
    mem.incr_ref(10, 1, None)
    mem.decr_ref(20, 1, None)  # at the same time as 2's allocation: the free sorts first
    assert mem.usage == 2048 and mem.peak == 3072
    assert [(e.timestamp, e.delta) for e in sorted(mem.events)] == [
        (10, 1024),
        (20, -1024),
        (20, 2048),
    ]
    assert mem.timeline() == [(10, 1024), (20, 0), (20, 2048)]
    assert mem.pop_event().timestamp == 10
    with pytest.raises(RuntimeError, match="before it was made"):
        mem.decr_ref(5, 2, None)


def test_a_deleted_tensor_is_freed_when_its_last_user_is_done() -> None:
    ftt = FakeTensorTracker()
    _fakes(ftt, {1: 256})
    mem = StreamMemoryTracker(WorkerStorageTracker(ftt))
    tm = TensorManager(ftt, mem)
    maker = _task([], [1])
    tm.add(1, (maker,), 0)
    tm.first_use(1, 0, None)
    tm.incr_ref(1, 7)  # a borrow
    tm.delete(1, 5, None)
    assert 1 in tm and mem.usage == 1024
    tm.decr_ref(1, maker, 10, None)
    assert 1 in tm  # the borrow still holds it
    tm.decr_ref(1, 7, 30, None)
    assert 1 not in tm and mem.usage == 0 and 1 not in ftt.tensors
    assert sorted(mem.events)[-1][:3] == (30, 0, -1024)


# -- workers ----------------------------------------------------------------------------------


def _worker(ftt: FakeTensorTracker, **costs: int) -> Worker:
    est = RuntimeEstimator()
    if costs:
        est.set_custom_timing({TimingType.KERNEL_LAUNCH: costs["launch"]})
    w = Worker(ftt, est)
    w.create_stream(0, "main", default=True)
    return w


def test_a_stream_runs_its_tasks_in_order_and_tracks_memory_and_the_trace() -> None:
    ftt = FakeTensorTracker()
    _fakes(ftt, {1: 256, 2: 256, 3: 256})
    w = _worker(ftt, launch=3)
    w.add_task(_task([], [1], start=0, runtime=10, meta=["randn"]), now=0)
    w.add_task(_task([], [2], start=1, runtime=10, meta=["randn"]), now=1)
    w.add_task(_task([1, 2], [3], start=2, runtime=20, meta=["mm"]), now=2)
    w.delete_refs([1, 2], 3)  # deleted while the mm still uses them
    _step(w)
    s = w.streams[0]
    assert [(e.start, e.end, e.meta[0]) for e in s.events] == [
        (0, 10, "randn"),
        (10, 20, "randn"),
        (20, 40, "mm"),
    ]
    assert s.now == 40
    assert [(e.start, e.runtime) for e in w.events] == [(0, 3), (1, 3), (2, 3)]
    # 1 and 2 freed when the mm finished; 3 lives on
    assert s.memory.timeline() == [(0, 1024), (10, 2048), (20, 3072), (40, 2048), (40, 1024)]
    assert s.memory.usage == 1024 and s.memory.peak == 3072
    assert set(s.tensors.tensors) == {3}
    # only the last finished task is kept (later tasks may still link to it)
    assert list(w.task_manager.tasks.values()) == [s.last_task]


def test_a_task_reading_a_tensor_its_stream_never_saw_is_refused() -> None:
    ftt = FakeTensorTracker()
    _fakes(ftt, {1: 4})
    w = _worker(ftt)
    with pytest.raises(KeyError, match="reads tensor 1"):
        w.add_task(_task([1], []), now=0)
    with pytest.raises(KeyError, match="stream 5"):
        w.add_task(_task([], [1]), now=0, stream=5)
    with pytest.raises(ValueError):
        w.create_stream(0, "again", default=False)


def test_a_cpu_tensor_is_shared_by_streams_and_uses_no_gpu_memory() -> None:
    ftt = FakeTensorTracker()
    _fakes(ftt, {1: 256, 2: 256})
    w = _worker(ftt)
    w.add_cpu_tensor(1, 0)
    w.add_task(_task([1], [2]), now=0)
    w.delete_refs([1], 1)
    _step(w)
    assert 1 not in w.cpu_tensors and w.streams[0].memory.peak == 1024


def test_a_collective_across_workers_waits_for_the_straggler() -> None:
    ftt = FakeTensorTracker()
    _fakes(ftt, {1: 4})
    a, b = _worker(ftt), _worker(ftt)
    b.add_task(_task([], [], start=0, runtime=300), now=0)  # b is busy until 300
    peers: list[Task] = []
    for w in (a, b):
        w.add_task(_task([], [], start=10, runtime=100, meta=["allreduce"], collectives=peers), 10)
    _step(a, b)
    ends = [w.streams[0].events[-1] for w in (a, b)]
    assert [(e.start, e.end) for e in ends] == [(10, 400), (300, 400)]


def test_a_collective_whose_peer_never_arrives_is_reported_blocked() -> None:
    ftt = FakeTensorTracker()
    a = _worker(ftt)
    peers: list[Task] = []
    t = _task([], [], collectives=peers)
    _task([], [], collectives=peers)  # a peer on a worker that is not simulated
    a.add_task(t, now=0)
    assert run_until_idle([a]) == [t] and t.state is TaskState.EXECUTING


def test_a_borrow_waits_for_the_lender_and_the_lender_waits_for_the_last_use() -> None:
    ftt = FakeTensorTracker()
    src = _fakes(ftt, {1: 256, 3: 256})[1]
    ftt.add({2: src}, is_borrowed=True)  # the borrowed name shares the lender's storage
    w = _worker(ftt)
    w.create_stream(1, "other", default=False)
    w.add_task(_task([], [1], start=0, runtime=100), now=0)  # the lender makes 1
    b = Borrow(ident=7, tensor_src_id=1, tensor_dst_id=2, from_stream=0, to_stream=1)
    lent = EventTask(w.streams[0].record_event(), 0, "main", 1, "other", 1, 2, borrow=None)
    w.borrow(lent, b)
    w.borrow_first_use(7, now=2)
    w.add_task(_task([2], [3], start=2, runtime=10, meta=["use"]), now=2, stream=1)
    _step(w)
    use = w.streams[1].events[-1]
    assert (use.start, use.end) == (100, 110)  # after the lender's task
    last = EventTask(w.streams[1].record_event(), 1, "other", 0, "main", 3, 3)
    w.borrow_last_use(last, 7)
    w.delete_refs([1], 4)  # the lender's name is deleted while lent
    assert 1 in w.streams[0].tensors
    w.delete_refs([2], 5)  # the borrowed name goes with the drop
    w.borrow_drop(7, now=5)
    _step(w)
    assert 1 not in w.streams[0].tensors  # freed once returned
    freed = [e for e in sorted(w.streams[0].memory.events) if e.delta < 0]
    assert [(e.timestamp, e.delta) for e in freed] == [(110, -1024)]
    assert w.streams[1].memory.peak == 1024  # only 3: the borrow costs nothing


def test_a_split_worker_group_goes_on_independently() -> None:
    ftt = FakeTensorTracker()
    _fakes(ftt, {1: 256, 2: 256, 3: 256})
    g = WorkerGroup([0, 1, 2, 3], ftt, RuntimeEstimator())
    g.create_stream(0, "main", default=True)
    g.add_task(_task([], [1], runtime=10), now=0)
    g.add_task(_task([1], [2], runtime=10), now=0)
    g.maybe_set_ready(), g.maybe_execute(), g.maybe_finish()  # the first task ran
    h = g.split([2, 3])
    assert g.workers.tolist() == [0, 1] and h.workers.tolist() == [2, 3]
    assert repr(h) == "WorkerGroup([2-3])"
    with pytest.raises(ValueError):
        g.split([3])
    # h alone gets another task and deletes 1
    h.add_task(_task([2], [3], runtime=50), now=0)
    h.delete_refs([1], 0)
    _step(g, h)
    assert g.streams[0].now == 20 and h.streams[0].now == 70
    assert set(g.streams[0].tensors.tensors) == {1, 2}
    assert set(h.streams[0].tensors.tensors) == {2, 3}
    assert g.streams[0].memory.usage == 2048 and h.streams[0].memory.usage == 2048
    assert 1 in ftt.tensors  # g still holds 1
    g.delete_refs([1], 30)
    assert 1 not in ftt.tensors


def test_workers_are_written_as_a_chrome_trace(tmp_path: Any) -> None:
    ftt = FakeTensorTracker()
    _fakes(ftt, {1: 256})
    w = _worker(ftt)
    w.add_task(_task([], [1], runtime=2000, meta=["randn"]), now=0)
    _step(w)
    path = tmp_path / "t" / "trace.json"
    write_trace({"rank 0": w}, str(path))
    events = json.loads(path.read_text())["traceEvents"]
    names = {(e["ph"], e["name"]) for e in events}
    assert ("X", "randn") in names and ("C", "memory") in names
    assert {"main", "CPU", "rank 0"} <= {e["args"]["name"] for e in events if e["ph"] == "M"}
    op = next(e for e in events if e["ph"] == "X" and e["tid"] == 1)
    assert (op["ts"], op["dur"]) == (0, 2)  # µs


def test_fake_call_moves_to_cuda_or_keeps_the_tensor_on_a_torch_without_it() -> None:
    def move() -> Any:
        t = torch.empty(4, 4)
        return t, t.cuda(), t.to("cuda", torch.float16)

    t, c, h = fake_call(move)
    want = "cuda" if torch.backends.cuda.is_built() else "cpu"
    assert c.device.type == h.device.type == want
    assert h.dtype == torch.float16 and c.shape == h.shape == (4, 4)
    assert c.untyped_storage()._cdata != t.untyped_storage()._cdata  # a copy, as .cuda()'s
