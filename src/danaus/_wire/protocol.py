"""The message protocol: one table of frame kinds, each with a typed header.

Every frame's header travels as a plain tuple ``(kind, *fields)`` of builtins
only (pickled by `danaus._wire.frame.encode_frame()` and unpickled with a
restricted unpickler that resolves no class at all): the ids
(``ProcId``, ``PortId``, ``ActorId``) travel as plain tuples. `wire()`
turns a typed header into that tuple, and `decode()` turns a received
tuple back into a `Message` with the typed header (ids rebuilt),
refusing an unknown kind, a header of the wrong length or a malformed id
with `ProtocolError`
(the connection it came on is closed; nothing else is affected).

Each header type serves exactly one kind (``kind_of``); the kind numbers are part of
the wire format and never change meaning. Kinds a release adds get new
numbers, and `PROTOCOL_VERSION` changes whenever a header changes, so
peers of different releases refuse each other in ``HELLO`` with an error
that names both versions instead of misreading each other's frames.

Flow of a connection (the connecting side speaks first). One connection
carries both directions between two procs:

    connector                                 acceptor
       |-- HELLO(proc, version, offload) ------>|  version differs:
       |<------------- REFUSED(reason) ---------|  refuse, close
       |<------------- WELCOME(proc, offload) --|  the acceptor's first frame
       |<=== CALL / REPLY / SPAWN / ... both ways ===>|

The connector sends nothing but ``HELLO`` (and ``PING``) before ``WELCOME``;
when both procs dial each other at once, the acceptor whose name is the
smaller holds back its ``WELCOME`` and the other connection wins
(``docs/design.md``, "One connection per pair").
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable, Mapping
from typing import Any, ForwardRef, NamedTuple

from .frame import Frame
from .headers import (
    _ARITY,
    _HEADERS,
    _KIND_OF,
    _KINDS,
    PROTOCOL_VERSION,
    STATUS_ERROR,
    STATUS_EXC,
    STATUS_OK,
    Attach,
    Bounce,
    Call,
    Cast,
    Failed,
    Gateway,
    GatewayOk,
    Gather,
    Hello,
    KillProcs,
    Kind,
    Log,
    LogAck,
    LogConfig,
    LogFlush,
    LogTail,
    Lost,
    Offload,
    OffloadOk,
    Open,
    Ping,
    ProtocolError,
    RdmaCheck,
    RdmaData,
    RdmaDrop,
    RdmaRelease,
    Ready,
    Refused,
    Relayed,
    Release,
    Reply,
    Return,
    Route,
    Shut,
    ShutdownHost,
    Spawn,
    SpawnProcs,
    Stack,
    Stats,
    StopActor,
    StopProc,
    Telemetry,
    TraceStart,
    TraceStop,
    Welcome,
)
from .ids import ActorId, PortId, ProcId

__all__ = [
    "CALL_TEMPLATE_PORT_LIMIT",
    "PROTOCOL_VERSION",
    "STATUS_ERROR",
    "STATUS_EXC",
    "STATUS_OK",
    "Attach",
    "Bounce",
    "Call",
    "CallTemplate",
    "Cast",
    "Failed",
    "Gateway",
    "GatewayOk",
    "Gather",
    "Hello",
    "KillProcs",
    "Kind",
    "Log",
    "LogAck",
    "LogConfig",
    "LogFlush",
    "LogTail",
    "Lost",
    "Message",
    "Offload",
    "OffloadOk",
    "Open",
    "Ping",
    "ProtocolError",
    "RdmaCheck",
    "RdmaData",
    "RdmaDrop",
    "RdmaRelease",
    "Ready",
    "Refused",
    "Relayed",
    "Release",
    "Reply",
    "Return",
    "Route",
    "Shut",
    "ShutdownHost",
    "Spawn",
    "SpawnProcs",
    "Stack",
    "Stats",
    "StopActor",
    "StopProc",
    "Telemetry",
    "TraceStart",
    "TraceStop",
    "Welcome",
    "decode",
    "decode_header",
    "kind_of",
    "wire",
]


# -- ids travel as tuples of builtins -------------------------------------------------
#
# A header on the wire holds builtins only: the ids (ProcId, PortId, ActorId) are
# NamedTuples on both ends but travel as plain tuples, so a header unpickles
# without naming a single class (faster, and nothing for an unpickler to
# resolve). Each field that holds ids has a converter pair, chosen by its
# annotation; ``wire`` flattens, ``decode_header`` rebuilds.

# Rebuilding uses tuple.__new__ (C) rather than a NamedTuple's generated __new__
# (Python): the lengths are checked here instead.
_tn = tuple.__new__


def _make_proc(t: object) -> ProcId:
    if type(t) is not tuple or len(t) != 2:
        raise TypeError(f"not a proc id: {t!r:.80}")
    return _tn(ProcId, t)


def _flat_port(p: PortId) -> tuple[Any, ...]:
    return (tuple(p[0]), p[1])


def _make_port(t: object) -> PortId:
    if type(t) is not tuple or len(t) != 2:
        raise TypeError(f"not a port id: {t!r:.80}")
    return _tn(PortId, (_make_proc(t[0]), t[1]))


def _flat_actor(a: ActorId) -> tuple[Any, ...]:
    return (tuple(a[0]), a[1], a[2])


def _make_actor(t: object) -> ActorId:
    if type(t) is not tuple or len(t) != 3:
        raise TypeError(f"not an actor id: {t!r:.80}")
    return _tn(ActorId, (_make_proc(t[0]), t[1], t[2]))


def _optional(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else fn(v)


# The keys of a boot dictionary (SPAWN_PROCS) that hold a ProcId.
_BOOT_PROCS = ("owner", "agent", "client")


def _flat_boot(boot: dict[str, Any]) -> dict[str, Any]:
    out = dict(boot)
    for key, value in boot.items():
        if isinstance(value, (ProcId, PortId, ActorId)):
            if key not in _BOOT_PROCS or type(value) is not ProcId:
                raise TypeError(f"boot key {key!r} holds an id ({value!r}) the wire cannot carry")
            out[key] = tuple(value)
    return out


def _make_boot(boot: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(boot)
    for key in _BOOT_PROCS:
        if out.get(key) is not None:
            out[key] = _make_proc(out[key])
    return out


# annotation -> (flatten, rebuild); None passes through every one of them (a few
# callers put None where the annotation says an id, e.g. a bounce with no sender).
_CONVERTERS: dict[str, tuple[Any, Any]] = {
    "ProcId": (tuple, _make_proc),
    "PortId": (_flat_port, _make_port),
    "ActorId": (_flat_actor, _make_actor),
    "tuple[ActorId, ...]": (
        lambda v: tuple(map(_flat_actor, v)),
        lambda v: tuple(map(_make_actor, v)),
    ),
    "tuple[ProcId, ...]": (
        lambda v: tuple(map(tuple, v)),
        lambda v: tuple(map(_make_proc, v)),
    ),
    "list[tuple[ProcId, dict[str, Any]]]": (
        lambda v: [(tuple(p), _flat_boot(b)) for p, b in v],
        lambda v: [(_make_proc(p), _make_boot(b)) for p, b in v],
    ),
}
_CONVERTERS = {k: (_optional(e), _optional(d)) for k, (e, d) in _CONVERTERS.items()}
_CONVERTERS.update({k + " | None": v for k, v in _CONVERTERS.items()})


def _codec(kind: int, cls: type[Any]) -> tuple[Any, Any]:
    """``(flatten, rebuild)`` for one header type: header -> wire tuple -> header."""
    convs = []
    for i, name in enumerate(cls._fields):
        raw = cls.__annotations__[name]  # a string (postponed annotations) or a ForwardRef
        ann: str = raw.__forward_arg__ if isinstance(raw, ForwardRef) else raw
        if ann in _CONVERTERS:
            convs.append((i, *_CONVERTERS[ann]))
        elif "Id" in ann:  # an id would travel as a class, which no peer can unpickle
            raise TypeError(f"{cls.__name__}.{name}: no converter for {ann!r}")
    if not convs:
        return (lambda h: (kind, *h)), (lambda raw: _tn(cls, raw[1:]))

    def flatten(h: tuple[Any, ...]) -> tuple[Any, ...]:
        out = [kind, *h]
        for i, enc, _ in convs:
            out[i + 1] = enc(h[i])
        return tuple(out)

    def rebuild(raw: tuple[Any, ...]) -> Any:
        vals = list(raw[1:])
        for i, _, dec in convs:
            vals[i] = dec(vals[i])
        return _tn(cls, vals)

    return flatten, rebuild


_CODECS = {k: _codec(int(k), cls) for k, cls in _HEADERS.items()}
_WIRE = {cls: _CODECS[k][0] for k, cls in _HEADERS.items()}
_REBUILD = {k: c[1] for k, c in _CODECS.items()}


# The hottest headers, by hand, at field positions read from the types (not typed in).
_CALL_PORT, _CALL_SENDER, _CALL_CHAIN = map(Call._fields.index, ("port", "sender", "chain"))
if Reply._fields[-1] != "sender":
    raise TypeError("the REPLY codec below expects the sender last")


def _call_rebuild(raw: tuple[Any, ...]) -> Call:
    # A call from the client has a port, no sender, no chain.
    vals = list(raw[1:])
    port, sender, chain = vals[_CALL_PORT], vals[_CALL_SENDER], vals[_CALL_CHAIN]
    if port is not None:
        vals[_CALL_PORT] = _make_port(port)
    if sender is not None:
        vals[_CALL_SENDER] = _make_actor(sender)
    if chain:
        vals[_CALL_CHAIN] = tuple(map(_make_actor, chain))
    return _tn(Call, vals)


def _reply_rebuild(raw: tuple[Any, ...]) -> Reply:
    if raw[-1] is None:
        return _tn(Reply, raw[1:])
    return _tn(Reply, (*raw[1:-1], _make_actor(raw[-1])))


_REPLY_KIND = int(Kind.REPLY)


def _reply_flatten(h: Reply) -> tuple[Any, ...]:
    sender = h[-1]
    return (_REPLY_KIND, *h[:-1], None if sender is None else _flat_actor(sender))


_REBUILD[Kind.CALL] = _call_rebuild
_REBUILD[Kind.REPLY] = _reply_rebuild
_WIRE[Reply] = _reply_flatten


class Message(NamedTuple):
    """A received frame with its typed header."""

    kind: Kind
    header: Any
    body: memoryview
    buffers: list[Any]


def kind_of(header: tuple[Any, ...]) -> Kind:
    """The kind of a typed header."""
    return _KIND_OF[type(header)]


def wire(header: tuple[Any, ...]) -> tuple[Any, ...]:
    """The tuple a typed header travels as: ``(kind, *fields)``, builtins only (ids
    become plain tuples)."""
    return _WIRE[type(header)](header)  # type: ignore[no-any-return]


# A port number that pickles as BININT ("J" + 4 bytes, little-endian): marks where
# the reply port's number sits in a CALL header's pickle. A template serves the
# ports below it (a bigger one might pickle otherwise).
CALL_TEMPLATE_PORT_LIMIT = 0x5A5A5A5A
_I32 = struct.Struct("<i")


class CallTemplate:
    """The pickle of ``wire(header)`` for a `Call`, as two halves around its
    reply port's number.

    The calls of an endpoint to one rank and slot, from one sender and chain,
    differ only in that number, so a sender builds a template once and makes
    each call's header bytes with `pickled()` (two joins, no pickling):
    the receiver decodes them exactly as those of ``encode_frame(wire(header))``.

    The template pickles ``header`` with its port number replaced by
    `CALL_TEMPLATE_PORT_LIMIT` and splits the bytes around that number's
    4 bytes. ``ValueError`` when ``header`` has no reply port, when the mark is
    not found exactly once (another field pickles the same bytes), or when a
    header made from the template does not unpickle to the original.
    """

    __slots__ = ("head", "tail")

    def __init__(self, header: Call) -> None:
        if header.port is None:
            raise ValueError("a header without a reply port has no template")
        me = header.port.proc
        marked = header._replace(port=PortId(me, CALL_TEMPLATE_PORT_LIMIT))
        h = pickle.dumps(wire(marked), protocol=5)
        mark = b"J" + _I32.pack(CALL_TEMPLATE_PORT_LIMIT)
        if h.count(mark) != 1:
            raise ValueError("the header's port mark is not unique")
        i = h.index(mark) + 1
        self.head, self.tail = h[:i], h[i + 4 :]
        if pickle.loads(self.pickled(7)) != wire(header._replace(port=PortId(me, 7))):
            raise ValueError("the header template does not round-trip")

    def pickled(self, port: int) -> bytes:
        """The pickled header of the same call with reply port number ``port``
        (``0 <= port < CALL_TEMPLATE_PORT_LIMIT``)."""
        return self.head + _I32.pack(port) + self.tail


def decode_header(raw: tuple[Any, ...]) -> tuple[Kind, Any]:
    """``(kind, typed header)`` of a wire tuple; `ProtocolError` if it is not one."""
    msg = decode(_tn(Frame, (raw, b"", [])))
    return msg.kind, msg.header


def decode(frame: Frame) -> Message:
    """The `Message` a received frame carries (its header typed); raises `ProtocolError`."""
    raw = frame[0]
    kind = raw[0]
    rebuild = _REBUILD.get(kind) if type(kind) is int else None
    if rebuild is None:
        what = repr(kind) if type(kind) is int else f"a {type(kind).__name__}, not an int"
        raise ProtocolError(f"frame of unknown kind {what}")
    if len(raw) - 1 != _ARITY[kind]:
        raise ProtocolError(
            f"{_HEADERS[kind].__name__} header with {len(raw) - 1} fields, expected {_ARITY[kind]}"
        )
    try:
        header = rebuild(raw)
    except Exception as e:  # whatever a malformed field raises (RecursionError too)
        raise ProtocolError(
            f"{_HEADERS[kind].__name__} header with a malformed id: {type(e).__name__}: {e}"
        ) from e
    return _tn(Message, (_KINDS[kind], header, frame[1], frame[2]))
