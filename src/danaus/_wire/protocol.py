"""The message protocol: one table of frame kinds, each with a typed header.

Every frame's header travels as a plain tuple ``(kind, *fields)`` of builtins
only (pickled by :func:`danaus._wire.frame.encode_frame` and unpickled with a
restricted unpickler that resolves no class at all): the ids
(``ProcId``, ``PortId``, ``ActorId``) travel as plain tuples. :func:`wire`
turns a typed header into that tuple, and :func:`decode` turns a received
tuple back into a :class:`Message` with the typed header (ids rebuilt),
refusing an unknown kind, a header of the wrong length or a malformed id
with :class:`ProtocolError`
(the connection it came on is closed; nothing else is affected).

Each header type serves exactly one kind (``kind_of``); the kind numbers are part of
the wire format and never change meaning. Kinds a release adds get new
numbers, and :data:`PROTOCOL_VERSION` changes whenever a header changes, so
peers of different releases refuse each other in ``HELLO`` with an error
that names both versions instead of misreading each other's frames.

Flow of a connection (the connecting side speaks first). One connection
carries both directions between two procs::

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

import enum
import pickle
import struct
from collections.abc import Callable, Mapping
from typing import Any, ForwardRef, NamedTuple

from .frame import Frame, FrameError
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

#: Changes whenever a header's fields or a kind's meaning change. Version 1 was
#: the untyped protocol of danaus 0.1 (its HELLO had no version). Version 3 added
#: the observing kinds (STATS, TRACE_*, STACK), the transfer's deadline to
#: RDMA_CHECK, a lease to its answer, and RDMA_RELEASE; version 4 the cast
#: tree's CAST and GATHER; version 5 WELCOME: one connection per pair of procs,
#: carrying both directions; version 6 sends ids in headers as plain tuples (a header
#: is builtins only); version 7 (no new kind) marks the RDMA data connection's
#: per-chunk payload tags, so a peer of version 6 is refused in HELLO, naming both
#: versions, instead of every transfer failing as tampered; version 8 added TELEMETRY;
#: version 9 adds CALL's and CAST's ``trace``, the OpenTelemetry context of the span
#: the call was made in; version 10 adds the relay through a gateway (``attach``):
#: GATEWAY, GATEWAY_OK, OPEN, RELAYED, SHUT and ROUTE; version 11 adds FAILED's
#: ``origin``, the actor a failure started at when it passed up unhandled.
PROTOCOL_VERSION = 11


class ProtocolError(FrameError):
    """A frame that is well formed but not a message of this protocol (unknown kind,
    wrong header length); its connection is closed."""


class Kind(enum.IntEnum):
    """Every kind of frame. Numbers are part of the wire format."""

    CALL = 1
    REPLY = 2
    HELLO = 3
    READY = 4
    LOST = 5
    BOUNCE = 6
    PING = 7
    OFFLOAD = 8
    OFFLOAD_OK = 9
    SPAWN_PROCS = 10
    KILL_PROCS = 11
    ATTACH = 12
    SHUTDOWN_HOST = 13
    REFUSED = 14
    RELEASE = 15
    SPAWN = 20
    STOP_ACTOR = 21
    STOP_PROC = 22
    FAILED = 23
    RDMA_CHECK = 40
    RDMA_DROP = 41
    RDMA_DATA = 42
    RDMA_RELEASE = 43
    LOG = 60
    LOG_ACK = 61
    LOG_TAIL = 62
    LOG_CONFIG = 63
    LOG_FLUSH = 64
    STATS = 70
    TRACE_START = 71
    TRACE_STOP = 72
    STACK = 73
    TELEMETRY = 74
    CAST = 50
    GATHER = 51
    WELCOME = 80
    RETURN = 87
    GATEWAY = 90
    GATEWAY_OK = 91
    OPEN = 92
    RELAYED = 93
    SHUT = 94
    ROUTE = 95


# -- the runtime --------------------------------------------------------------


class Call(NamedTuple):
    """A message to actor ``mesh[rank]``; the body holds the arguments."""

    mesh: str
    rank: int
    method: str
    port: PortId | None  # where the reply goes; None for a broadcast
    slot: int  # the reply's slot at that port (its index in the caller's collector)
    labels: tuple[str, ...]  # the mesh's extent, as seen by the caller
    sizes: tuple[int, ...]
    sender: ActorId | None  # who to return the message to if it is undeliverable
    chain: tuple[ActorId, ...]  # actors blocked on this call (deadlock reporting)
    flags: int
    # (trace id, span id, trace flags) of the caller's OpenTelemetry span: None unless
    # telemetry is on and the call was made inside a span (danaus._actor.core.telemetry)
    trace: tuple[int, int, int] | None = None


# A Reply's status: its body is the value / the exception the endpoint raised / why the
# message was undeliverable or its sender failed.
STATUS_OK, STATUS_EXC, STATUS_ERROR = 0, 1, 2


class Reply(NamedTuple):
    """A value for local port ``port`` (the body); ``status`` (``STATUS_*``) says how to
    read it."""

    port: int
    slot: int
    status: int
    sender: ActorId | None = None  # a port send from an actor: bounced back if closed


class Hello(NamedTuple):
    """The first frame on every connection: who is calling, in which protocol."""

    proc: ProcId
    version: int
    offload: tuple[Any, ...]  # (pid, host key, probe address, probe length) or ()


class Welcome(NamedTuple):
    """The acceptor takes the connection for both directions: its first frame on it."""

    proc: ProcId
    offload: tuple[Any, ...]  # as in HELLO: lets the connector offload to the acceptor


class Refused(NamedTuple):
    """The acceptor refuses the connection (e.g. another protocol version) and closes it."""

    reason: str


class Ready(NamedTuple):
    """A proc we spawned is up; ``error`` says why its bootstrap failed, if it did."""

    proc: ProcId
    error: str | None


class Lost(NamedTuple):
    """The host agent saw proc ``name`` exit."""

    name: str
    reason: str


class Bounce(NamedTuple):
    """A message ``sender`` sent to ``dest`` could not be delivered."""

    sender: ActorId
    dest: str
    reason: str


class Ping(NamedTuple):
    """A heartbeat on a quiet TCP connection."""


# -- the relay through a gateway (``attach``; danaus._runtime.messaging.relay) --------


class Gateway(NamedTuple):
    """A client asks the worker it dialled to relay all of its traffic (the first frame
    on that connection, instead of HELLO)."""

    proc: ProcId
    version: int


class GatewayOk(NamedTuple):
    """The gateway relays for the client; procs reach it through ``relay`` (``tcp://``)."""

    proc: ProcId
    relay: str


class Open(NamedTuple):
    """On a gateway connection: relayed connection ``chan`` to proc ``target`` begins."""

    chan: int
    target: ProcId


class Relayed(NamedTuple):
    """On a gateway connection: a frame of relayed connection ``chan``; ``header`` is
    its wire header, the body and buffers are its own."""

    chan: int
    header: tuple[Any, ...]


class Shut(NamedTuple):
    """On a gateway connection: relayed connection ``chan`` closed, for ``reason``."""

    chan: int
    reason: str


class Route(NamedTuple):
    """The first frame on a connection to a gateway's relay port: relay it to ``target``."""

    target: ProcId


# -- large buffers between procs of one host ----------------------------------------


class Offload(NamedTuple):
    """Frame ``inner`` (a wire tuple) whose big buffers the receiver copies out of
    the sender's memory (``descs``: (buffer index, address, length), followed by
    (memfd, slot uid) when the copy lies in a shared slot the receiver may map)."""

    token: int
    descs: tuple[tuple[int, ...], ...]
    inner: tuple[Any, ...]


class OffloadOk(NamedTuple):
    """Proc ``name`` can read our memory: offload big buffers to it."""

    name: str


class Release(NamedTuple):
    """The receiver has copied (or mapped) offloaded buffers ``token``: the sender
    stops counting them against its send limit."""

    token: int


class Return(NamedTuple):
    """Shared snapshot slots ``uids`` the receiver mapped are no longer referenced
    there (or were copied instead): the sender may reuse them."""

    uids: tuple[int, ...]


# -- host agents ---------------------------------------------------------------


class SpawnProcs(NamedTuple):
    """Ask a host agent to start ``procs``: ((ProcId, boot dict), ...)."""

    requester: ProcId
    procs: list[tuple[ProcId, dict[str, Any]]]


class KillProcs(NamedTuple):
    """SIGKILL these procs of the agent's host."""

    names: list[str]


class Attach(NamedTuple):
    """A client attaches to a worker's host agent; the answer goes to ``port``."""

    client: ProcId
    port: PortId


class ShutdownHost(NamedTuple):
    """The client is done with this worker host: its agent exits."""


# -- actors and supervision -------------------------------------------------------------


class Spawn(NamedTuple):
    """Create actor ``mesh[rank]`` (class and arguments in the body)."""

    mesh: str
    rank: int
    port: PortId  # where the result of __init__ goes
    slot: int
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    owner: ActorId | None
    mode: str


class StopActor(NamedTuple):
    """Stop actor ``mesh[rank]`` once its inbox drains; answer ``port``."""

    mesh: str
    rank: int
    port: PortId
    slot: int
    reason: str


class StopProc(NamedTuple):
    """Stop every actor of the proc, then the proc."""

    port: PortId | None
    slot: int
    reason: str


class Failed(NamedTuple):
    """Actor ``mesh[rank]`` failed; sent to the proc of its ``owner``."""

    owner: ActorId | None
    mesh: str
    rank: int
    reason: str
    traceback: str
    # Monarch's name of the actor the failure started at, where it passed up to
    # this one unhandled (an actor it spawned failed); "" when it failed itself.
    origin: str


# -- the data plane -------------------------------------------------------------


class RdmaCheck(NamedTuple):
    """May these one-sided copies go ahead? One answer per entry to ``port``."""

    entries: tuple[tuple[int, int, int], ...]  # (buffer id, offset, length)
    port: PortId
    slot: int
    # the transfer's deadline (time.monotonic() of this host), or, below zero, minus the
    # seconds it has left (a holder on another host, whose clock is not ours)
    deadline: float


class RdmaRelease(NamedTuple):
    """A transfer pinned by these RDMA_CHECK answers (lease ids) has ended."""

    leases: tuple[int, ...]


class RdmaDrop(NamedTuple):
    """Forget these registered buffers."""

    buffer_ids: tuple[int, ...]
    port: PortId
    slot: int


class RdmaData(NamedTuple):
    """Where is your data server? (for copies across hosts)"""

    port: PortId
    slot: int


# -- logs ---------------------------------------------------------------------


class Log(NamedTuple):
    """Complete lines (the body) that proc ``proc`` wrote to ``stream`` (1 stdout, 2 stderr).

    Sent by a host agent to its client. ``dropped`` lines of that stream were
    dropped just before these (the client did not keep up); the body may be
    empty when only a drop is reported. ``label`` and ``coords`` name the proc
    in prefixes (``trainer``, ``hosts=1,gpus=3``).
    """

    proc: str
    label: str
    coords: str
    stream: int
    dropped: int


class LogAck(NamedTuple):
    """The client has printed ``nbytes`` more bytes of LOG bodies: the agent may send more."""

    nbytes: int


class LogTail(NamedTuple):
    """The last lines proc ``name`` wrote before it crashed (to its owner, before LOST)."""

    name: str
    lines: tuple[str, ...]


class LogConfig(NamedTuple):
    """Log options for ``procs``: to their host agent, ``stream`` (forward to the client:
    1, or not: 0) and ``label``; to the procs themselves, the Python logging ``level``.
    -1 (and an empty label) keeps the current value."""

    procs: tuple[str, ...]
    stream: int
    level: int
    label: str


class LogFlush(NamedTuple):
    """Forward every line ``procs`` have written so far, then answer ``port`` (a barrier)."""

    procs: tuple[str, ...]
    port: PortId
    slot: int


# -- observing (answered on the I/O thread, so a busy actor never delays them) -------


class Stats(NamedTuple):
    """Send this proc's actors, endpoint metrics and connections to ``port``."""

    port: PortId
    slot: int


class TraceStart(NamedTuple):
    """Start recording spans; the answer (``port``) carries this proc's clock."""

    port: PortId
    slot: int


class TraceStop(NamedTuple):
    """Stop recording spans and send them to ``port``."""

    port: PortId
    slot: int


class Telemetry(NamedTuple):
    """Send this proc's recent messages, spans and ended actors (its rings) to ``port``."""

    port: PortId
    slot: int


class Stack(NamedTuple):
    """Dump this proc's stacks (py-spy, or Python's own frames) to ``port``."""

    port: PortId
    slot: int


# -- the cast tree (danaus._mesh.tree, danaus._runtime.messaging.tree) -----------------------


class Cast(NamedTuple):
    """A message to the selected actors of subtree ``[lo, hi)`` of mesh ``mesh``'s
    cast tree; the receiver is the proc of rank ``lo``. The body holds the arguments."""

    mesh: str
    name: str  # the mesh's name, for error messages
    method: str
    port: PortId | None  # replies: the parent's gather port (gather) or the caller's; None
    gather: bool  # combine the subtree's replies into one GATHER to ``port``
    selection: tuple[Any, ...]  # danaus._mesh.tree.Selection.to_wire()
    lo: int
    hi: int
    fanout: int
    table: tuple[ProcId, ...] | None  # procs of ranks [lo, hi): sent once per sender and mesh
    labels: tuple[str, ...]  # the caller's slice's extent (each message's rank)
    sizes: tuple[int, ...]
    sender: ActorId | None
    chain: tuple[ActorId, ...]
    flags: int
    hops: int  # how many procs this frame has passed through, the sender included
    trace: tuple[int, int, int] | None = None  # as Call.trace


class Gather(NamedTuple):
    """The ``entries`` replies of subtree ``child`` for gather port ``port``; the body
    is a restricted pickle (``danaus._runtime.messaging.tree.encode_entries``)."""

    port: int
    child: int
    entries: int


_HEADERS: dict[int, Any] = {
    Kind.CALL: Call,
    Kind.REPLY: Reply,
    Kind.HELLO: Hello,
    Kind.REFUSED: Refused,
    Kind.READY: Ready,
    Kind.LOST: Lost,
    Kind.BOUNCE: Bounce,
    Kind.PING: Ping,
    Kind.OFFLOAD: Offload,
    Kind.OFFLOAD_OK: OffloadOk,
    Kind.RELEASE: Release,
    Kind.SPAWN_PROCS: SpawnProcs,
    Kind.KILL_PROCS: KillProcs,
    Kind.ATTACH: Attach,
    Kind.SHUTDOWN_HOST: ShutdownHost,
    Kind.SPAWN: Spawn,
    Kind.STOP_ACTOR: StopActor,
    Kind.STOP_PROC: StopProc,
    Kind.FAILED: Failed,
    Kind.RDMA_CHECK: RdmaCheck,
    Kind.RDMA_DROP: RdmaDrop,
    Kind.RDMA_DATA: RdmaData,
    Kind.LOG: Log,
    Kind.LOG_ACK: LogAck,
    Kind.LOG_TAIL: LogTail,
    Kind.LOG_CONFIG: LogConfig,
    Kind.LOG_FLUSH: LogFlush,
    Kind.STATS: Stats,
    Kind.TRACE_START: TraceStart,
    Kind.TRACE_STOP: TraceStop,
    Kind.STACK: Stack,
    Kind.TELEMETRY: Telemetry,
    Kind.RDMA_RELEASE: RdmaRelease,
    Kind.CAST: Cast,
    Kind.GATHER: Gather,
    Kind.WELCOME: Welcome,
    Kind.RETURN: Return,
    Kind.GATEWAY: Gateway,
    Kind.GATEWAY_OK: GatewayOk,
    Kind.OPEN: Open,
    Kind.RELAYED: Relayed,
    Kind.SHUT: Shut,
    Kind.ROUTE: Route,
}
_KIND_OF: dict[type, Kind] = {cls: Kind(k) for k, cls in _HEADERS.items()}
# The tables' own invariants, checked at import (raised, so they hold under ``python -O``).
if len(_KIND_OF) != len(_HEADERS):
    raise TypeError("a header type serves one kind: two kinds share a header type")
if set(_HEADERS) != {int(k) for k in Kind}:
    raise TypeError("every kind has exactly one header type: a kind has none, or one is extra")
_ARITY = {k: len(cls._fields) for k, cls in _HEADERS.items()}
_KINDS = {int(k): k for k in Kind}


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
    """The pickle of ``wire(header)`` for a :class:`Call`, as two halves around its
    reply port's number.

    The calls of an endpoint to one rank and slot, from one sender and chain,
    differ only in that number, so a sender builds a template once and makes
    each call's header bytes with :meth:`pickled` (two joins, no pickling):
    the receiver decodes them exactly as those of ``encode_frame(wire(header))``.

    The template pickles ``header`` with its port number replaced by
    :data:`CALL_TEMPLATE_PORT_LIMIT` and splits the bytes around that number's
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
    """``(kind, typed header)`` of a wire tuple; :class:`ProtocolError` if it is not one."""
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
        return _KINDS[kind], rebuild(raw)
    except Exception as e:  # whatever a malformed field raises (RecursionError too)
        raise ProtocolError(
            f"{_HEADERS[kind].__name__} header with a malformed id: {type(e).__name__}: {e}"
        ) from e


def decode(frame: Frame) -> Message:
    """The :class:`Message` a received frame carries; raises :class:`ProtocolError`."""
    kind, header = decode_header(frame.header)
    return _tn(Message, (kind, header, frame[1], frame[2]))
