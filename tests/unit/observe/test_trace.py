"""A trace's Chrome JSON from the procs' span rings, without a proc: clocks aligned by
each proc's offset, async spans paired, calls linked to their handling by flows."""

from __future__ import annotations

from typing import Any

from danaus._observe.trace import chrome_trace

T0 = 1_000_000  # the client's clock (ns) when the trace started


def _proc(proc: str, events: list[tuple[Any, ...]], **kw: Any) -> dict[str, Any]:
    return {"proc": proc, "pid": 4242, "name": "trainers", "threads": {7: "actor"},
            "events": events, **kw}  # fmt: skip


def test_spans_are_placed_on_the_clients_time_line_one_perfetto_process_per_proc() -> None:
    client = _proc("c", [("X", "call step", "call", T0 + 2_000, 5_000, 7, None, None, "k1")],
                   client=True)  # fmt: skip
    # this proc's clock runs 10 ms ahead of the client's: its offset puts it back
    worker = _proc("p1", [("X", "step", "actor", T0 + 10_000_000 + 4_000, 1_000, 7,
                           {"rank": 0}, "k1", None)], dropped=3)  # fmt: skip
    trace = chrome_trace([(client, 0), (worker, 10_000_000)], T0, wall0=123)
    ev = trace["traceEvents"]
    names = [e["args"]["name"] for e in ev if e["name"] == "process_name"]
    assert names == ["client c", "proc p1 (trainers) pid 4242"]
    spans = {e["name"]: e for e in ev if e["ph"] == "X"}
    assert (spans["call step"]["pid"], spans["call step"]["ts"]) == (1, 2.0)
    assert (spans["step"]["pid"], spans["step"]["ts"], spans["step"]["dur"]) == (2, 4.0, 1.0)
    assert spans["step"]["args"] == {"rank": 0} and spans["call step"]["args"] == {}
    # the call is linked to where it was handled
    (start,) = [e for e in ev if e["ph"] == "s"]
    (finish,) = [e for e in ev if e["ph"] == "f"]
    assert (start["pid"], start["ts"], finish["pid"], finish["ts"]) == (1, 2.0, 2, 4.0)
    assert start["id"] == finish["id"] and start["cat"] == "call"
    assert trace["otherData"] == {"generator": "danaus", "started_unix_ns": 123, "procs": 2,
                                  "dropped": 3}  # fmt: skip


def test_async_spans_are_paired_and_an_end_without_its_begin_is_dropped() -> None:
    events = [
        ("b", "transfer", "rdma", T0 + 1_000, 9, 7, {"bytes": 10}),
        ("e", "orphan", "rdma", T0 + 1_500, 99, 7, None),
        ("e", "transfer", "rdma", T0 + 3_000, 9, 7, None),
        ("b", "never ended", "rdma", T0 + 4_000, 10, 7, None),
    ]
    trace = chrome_trace([(_proc("p", events), 0)], T0, 0)
    paired = [(e["ph"], e["ts"], e["id"]) for e in trace["traceEvents"] if e["ph"] in "be"]
    assert paired == [("b", 1.0, 9), ("e", 3.0, 9)]


def test_a_reply_flow_is_told_from_a_call_and_unmatched_flows_are_left_out() -> None:
    a = _proc("a", [("X", "send", "call", T0, 1_000, 7, None, None, ["r:1", "x:2"])])
    b = _proc("b", [("X", "recv", "reply", T0 + 1_000, 1_000, 7, None, "r:1", None)])
    flows = [e for e in chrome_trace([(a, 0), (b, 0)], T0, 0)["traceEvents"] if e["ph"] == "s"]
    assert [(f["cat"], f["pid"]) for f in flows] == [("reply", 1)]
