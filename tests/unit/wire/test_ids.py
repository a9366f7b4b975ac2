"""Identifiers (``_wire.ids``): Monarch's ``Uid`` semantics and the string forms of
proc and actor ids, which users read and parse back."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danaus._wire.ids import ActorId, PortId, ProcId, Uid

labels = st.from_regex(r"[A-Za-z0-9_.\-]{1,12}", fullmatch=True)


@given(label=st.none() | labels, value=st.integers(0, 2**64 - 1))
def test_an_instance_uid_round_trips_through_its_string_and_pickle(
    label: str | None, value: int
) -> None:
    uid = Uid(label, value)
    assert Uid.from_string(str(uid)) == uid
    assert pickle.loads(pickle.dumps(uid)) == uid
    assert Uid.from_string(str(uid)).label == label


def test_an_instance_is_its_value_and_a_singleton_is_its_label() -> None:
    a, b = Uid("x", 7), Uid("y", 7)
    assert a == b and hash(a) == hash(b)  # the label of an instance is for display only
    assert Uid.singleton("x") == Uid.from_string("x") != Uid("x", 7)
    assert Uid.singleton("x") != Uid.singleton("y")
    assert Uid.instance("w") != Uid.instance("w")  # fresh each time
    assert str(Uid(None, 255)) == "<ff>" and str(Uid.singleton("s")) == "s"
    assert Uid.singleton("s").is_singleton and Uid.anonymous().is_instance
    assert len({Uid.singleton("s"), Uid.from_string("s"), Uid(None, 1), Uid("z", 1)}) == 2


def test_uid_forms_parse_back_and_compare_as_monarch_says() -> None:
    a, b = Uid.instance("worker"), Uid.anonymous()
    assert a.is_instance and not a.is_singleton and a.label == "worker"
    assert b.label is None and str(b).startswith("<")
    assert Uid.from_string(str(a)) == a and Uid.from_string(str(b)) == b
    assert a != Uid.instance("worker")  # instances are fresh
    # An instance's label is only for display: it takes no part in equality.
    assert Uid.from_string(str(a).replace("worker", "other")) == a
    assert Uid.from_string("root") == Uid.singleton("root") != Uid.singleton("other")
    assert len({Uid.from_string("root"), Uid.singleton("root")}) == 1
    for bad in ("", "a b", "x<zz>"):
        with pytest.raises(ValueError, match="invalid uid"):
            Uid.from_string(bad)


@pytest.mark.parametrize("bad", ["", "a b", "x<zz>", "<>", "a<12345678901234567>", "<1"])
def test_a_malformed_uid_is_refused_saying_how_to_write_one(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid uid"):
        Uid.from_string(bad)


def test_a_uid_needs_a_valid_label_or_a_value() -> None:
    with pytest.raises(ValueError, match="invalid uid label"):
        Uid("has space", 1)
    with pytest.raises(ValueError, match="a singleton Uid needs a label"):
        Uid(None, None)
    with pytest.raises(TypeError, match="needs a str"):
        Uid.from_string(3)  # type: ignore[arg-type]


def test_proc_and_actor_ids_read_and_parse_as_monarch_writes_them() -> None:
    proc = ProcId("host0.proc3", "unix:/run/d/p3;host:h0")
    actor = ActorId(proc, "trainers", 2)
    assert str(proc) == "host0.proc3" and proc.uid == Uid.singleton("host0.proc3")
    assert str(actor) == "host0.proc3/trainers[2]"
    assert actor.proc_id == "host0.proc3@unix:/run/d/p3;host:h0"
    assert ProcId.from_string(actor.proc_id) == proc  # the '@' splits once
    assert (actor.proc_name, actor.actor_name, actor.addr) == ("host0.proc3", "trainers", proc.addr)
    assert str(PortId(proc, 17)) == "host0.proc3:17"
    for bad in ("noat", "@addr", "name@"):
        with pytest.raises(ValueError, match="write it 'name@address'"):
            ProcId.from_string(bad)


def test_ids_are_plain_tuples_of_builtins_as_headers_need() -> None:
    actor = ActorId(ProcId("p", "a"), "m", 0)
    assert actor == (("p", "a"), "m", 0) and hash(actor) == hash((("p", "a"), "m", 0))
