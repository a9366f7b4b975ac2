"""The typed protocol: one kind per header type, strict decoding, restricted headers."""

from __future__ import annotations

import os
import pickle

import pytest

from danaus._wire.frame import FrameDecoder, FrameError, encode_frame
from danaus._wire.ids import ActorId, PortId, ProcId
from danaus._wire.protocol import (
    CALL_TEMPLATE_PORT_LIMIT,
    PROTOCOL_VERSION,
    Call,
    CallTemplate,
    Cast,
    Failed,
    Hello,
    Kind,
    ProtocolError,
    Reply,
    SpawnProcs,
    decode,
    decode_header,
    kind_of,
    wire,
)

PROC = ProcId("p1", "unix:/tmp/x.sock;host:abc")
PORT = PortId(PROC, 7)


def _decoded(header: tuple) -> object:
    data = b"".join(bytes(memoryview(p).cast("B")) for p in encode_frame(header, b"body"))
    dec = FrameDecoder()
    dec.buffer()[: len(data)] = data
    (frame,) = dec.feed(len(data))
    return frame


def test_every_kind_has_exactly_one_header_type_and_round_trips() -> None:
    sender = ActorId(PROC, "m.1", 0)
    call = Call("m.1", 3, "echo", PORT, 2, ("gpus",), (4,), sender, (sender,), 1)
    msg = decode(_decoded(wire(call)))  # through real framing and the restricted unpickler
    assert msg.kind is Kind.CALL and msg.header == call and type(msg.header) is Call
    assert msg.header.method == "echo" and bytes(msg.body) == b"body"
    assert type(msg.header.port) is PortId and type(msg.header.port.proc) is ProcId
    assert type(msg.header.chain[0]) is ActorId and msg.header.sender.proc.name == "p1"
    assert kind_of(Reply(7, 0, 0)) is Kind.REPLY
    assert wire(Reply(7, 0, 0)) == (int(Kind.REPLY), 7, 0, 0, None)


def test_ids_travel_as_plain_tuples_and_come_back_typed() -> None:
    # Every header type that holds ids: the wire tuple holds builtins only.
    def plain(v: object) -> bool:
        if isinstance(v, (ProcId, PortId, ActorId)):
            return False
        if isinstance(v, (tuple, list)):
            return all(plain(x) for x in v)
        if isinstance(v, dict):
            return all(plain(x) for x in v.values())
        return True

    actor = ActorId(PROC, "m", 1)
    headers = [
        Call("m", 0, "f", None, 0, (), (), None, (), 0),
        Reply(1, 2, 0, actor),
        Hello(PROC, PROTOCOL_VERSION, ()),
        SpawnProcs(PROC, [(PROC, {"owner": PROC, "agent": PROC, "client": None, "x": 1})]),
        Cast("m", "n", "f", PORT, True, ("l", (0,), (0,)), 0, 1, 16, (PROC,), (), (), actor,
             (actor,), 0, 1),
        Failed(actor, "m", 0, "r", "tb", ""),
    ]  # fmt: skip
    for h in headers:
        raw = wire(h)
        assert plain(raw), raw
        assert pickle.loads(pickle.dumps(raw)) == raw
        assert decode_header(raw) == (kind_of(h), h)
    _, spawn = decode_header(wire(headers[3]))
    assert type(spawn.procs[0][1]["owner"]) is ProcId


def test_a_malformed_id_is_a_protocol_error() -> None:
    good = wire(Call("m", 0, "f", PORT, 0, (), (), None, (), 0))
    bad = (*good[:4], ("not a proc", 7), *good[5:])
    with pytest.raises(ProtocolError, match="Call header with a malformed id"):
        decode_header(bad)
    with pytest.raises(ProtocolError, match="malformed id"):
        decode_header((int(Kind.HELLO), 5, PROTOCOL_VERSION, ()))


def test_an_unknown_kind_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="unknown kind 99"):
        decode_header((99, "x"))
    with pytest.raises(ProtocolError, match="unknown kind"):
        decode_header(("1", "x"))  # kinds are ints, not strings that look like them


def test_a_header_of_the_wrong_length_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="Call header with 3 fields, expected 11"):
        decode_header((int(Kind.CALL), "m", 0, "echo"))


def test_a_protocol_error_is_a_frame_error_so_the_connection_is_closed() -> None:
    assert issubclass(ProtocolError, FrameError)


class _Boom:
    def __reduce__(self):
        return (os._exit, (3,))  # would end the process if it were ever called


@pytest.mark.parametrize(
    "header",
    [(1, os.system), (1, _Boom()), (1, SystemExit), (1, pickle.loads), (1, PORT)],
    ids=["function", "reduce", "exception-class", "pickle.loads", "danaus-id"],
)
def test_a_header_naming_anything_but_builtins_is_refused_before_it_runs(header) -> None:
    raw = pickle.dumps(header, protocol=5)
    body = b""
    prefix = __import__("struct").pack("<QIIQ", 16 + len(raw), len(raw), 0, len(body))
    dec = FrameDecoder()
    data = prefix + raw
    dec.buffer()[: len(data)] = data
    with pytest.raises(FrameError, match="undecodable frame header"):
        dec.feed(len(data))


def test_hello_carries_the_protocol_version() -> None:
    hello = Hello(PROC, PROTOCOL_VERSION, ())
    assert decode_header(wire(hello)) == (Kind.HELLO, hello)


# -- the CALL header's template (adverbs' cached header pickles) -----------------------


def test_the_call_template_pickles_what_encode_frame_would() -> None:
    me = ProcId("c1", "unix:/tmp/x.sock")
    sender = ActorId(ProcId("p2", "tcp://10.0.0.1:5"), "m", 3)
    for chain in [(), (sender,)]:
        header = Call("mesh-1", 2, "echo", PortId(me, 0), 1, ("hosts", "gpus"), (1, 4), sender,
                      chain, 0)  # fmt: skip
        tmpl = CallTemplate(header)
        for port in [0, 1, 255, 65_536, 10**6, CALL_TEMPLATE_PORT_LIMIT - 1]:
            h = header._replace(port=PortId(me, port))
            assert pickle.loads(tmpl.pickled(port)) == wire(h)
            assert pickle.loads(encode_frame(wire(h))[0][24:]) == wire(h)
            assert decode_header(pickle.loads(tmpl.pickled(port)))[1] == h


def test_a_call_template_is_refused_without_a_port_or_a_unique_mark() -> None:
    me = ProcId("c1", "unix:/tmp/x.sock")
    header = Call("m", 0, "f", None, 0, (), (), None, (), 0)
    with pytest.raises(ValueError, match="without a reply port"):
        CallTemplate(header)
    # Another field that pickles as the port's mark: the split would be ambiguous.
    marked = header._replace(port=PortId(me, 0), slot=CALL_TEMPLATE_PORT_LIMIT)
    with pytest.raises(ValueError, match="not unique"):
        CallTemplate(marked)
