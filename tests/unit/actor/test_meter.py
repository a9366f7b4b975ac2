"""An actor's Meter: endpoint metrics, and the rows and spans of sampled calls."""

from __future__ import annotations

from danaus._actor.core.measure import Meter
from danaus._runtime.messaging.metrics import MessageRow, Recent, Tracer
from danaus._wire.ids import PortId

from .conftest import CALLER, FakeHost


def meter(host: FakeHost) -> Meter:
    m = Meter(host, "counter.1", 2, subject=object())
    m.named("counter", "Counter")
    return m


def test_each_execution_counts_and_ends_the_running_endpoint() -> None:
    host = FakeHost()
    m = meter(host)
    m.running = "incr"
    m.measured("incr", 0, True, None, 0, None, None)
    m.measured("incr", 0, False, None, 0, None, None)
    st = m.stats["incr"]
    assert (st.calls, st.errors) == (2, 1) and m.running is None
    assert st.max > 0


def test_metrics_off_counts_nothing() -> None:
    host = FakeHost()
    host.observing.metrics = False
    m = meter(host)
    m.measured("incr", 0, True, None, 0, None, None)
    assert m.stats == {}


def test_a_sampled_call_leaves_its_row_and_its_span() -> None:
    recent = Recent(size=10, per_s=1000)
    host = FakeHost(recent)
    m = meter(host)
    row = MessageRow(5, 1)
    row.mesh_id, row.rank, row.endpoint, row.sender, row.request_bytes = (
        "counter.1",
        2,
        "incr",
        "client",
        10,
    )
    m.measured("incr", 6, True, PortId(CALLER, 1), 2, row, None)
    assert list(recent.messages) == [row]
    assert row.started_ns == 6 and row.ended_ns > 6 and row.ok
    copied = recent.copy()["messages"][0]
    assert copied == [5, 6, row.ended_ns, "counter.1", 2, "incr", "client", 10, None, True, 1]
    ((name, t0, _t1, actor, *_ids, attrs),) = recent.spans
    assert (name, t0, actor) == ("Counter.incr", 6, "counter[2]")
    assert attrs == {"endpoint": "incr", "class": "Counter", "ok": True, "kind": "endpoint"}


def test_a_running_trace_gets_a_span_per_execution() -> None:
    host = FakeHost()
    host.tracer = Tracer(max_events=10)
    m = meter(host)
    m.measured("incr", 0, True, PortId(CALLER, 4), 1, None, None)
    ((ph, name, cat, *_rest, flow_in, _flow_out),) = host.tracer.events
    assert (ph, name, cat, flow_in) == ("X", "counter.incr", "execute", "c:client:4:1")


def test_a_message_row_iterates_as_the_plain_row_in_field_order() -> None:
    row = MessageRow(1, 3)
    row.mesh_id, row.endpoint, row.request_bytes = "m", "e", 4
    row.reply_bytes = 9
    assert list(row) == [1, 0, 0, "m", 0, "e", None, 4, 9, True, 3]
    assert len(list(row)) == len(MessageRow.FIELDS)
    assert "reply_bytes=9" in repr(row)
