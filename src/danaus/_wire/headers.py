"""The protocol's table: ``Kind``, every frame kind, and one ``NamedTuple`` header
type per kind (``protocol.py`` says how they travel, and re-exports them)."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from .frame import FrameError
from .ids import ActorId, PortId, ProcId

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
