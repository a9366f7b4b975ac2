"""Monarch's ``monarch.common.messages``: the messages its controller sends its workers.

danaus's tensor engine has no controller: the client sends its own commands
straight to the worker actors (``danaus._tensor.messages``). These are Monarch's
message types, field for field, for what a Monarch program or tool does with them:
construct them, match on them, price them (``danaus.simulator.profiling.RuntimeEstimator``),
hand them to a controller object of its own (``danaus.common.client.Client`` and
``danaus.simulator.mock_controller.MockController``). danaus's simulator names its
controller trace after them (``docs/simulator.md``). Nothing in danaus executes them.
"""

from __future__ import annotations

from traceback import FrameSummary
from typing import Any, Literal, NamedTuple

__all__ = [
    "BackendNetworkInit",
    "BackendNetworkPointToPointInit",
    "BorrowCreate",
    "BorrowDrop",
    "BorrowFirstUse",
    "BorrowLastUse",
    "CallActorMethod",
    "CallFunction",
    "CallRecording",
    "CommandGroup",
    "CreateDeviceMesh",
    "CreatePipe",
    "CreateRemoteProcessGroup",
    "CreateStream",
    "DebuggerMessage",
    "DebuggerRead",
    "DebuggerWrite",
    "DefineRecording",
    "DeleteRefs",
    "DependentOnError",
    "Dims",
    "Exit",
    "FetchResult",
    "InternalException",
    "PipeRecv",
    "RecordingFormal",
    "RecordingResult",
    "Reduce",
    "RemoteFunctionFailed",
    "RemoteGeneratorFailed",
    "RequestStatus",
    "Restarted",
    "SendResultOfActorCall",
    "SendTensor",
    "SendValue",
    "SplitComm",
    "SplitCommForProcessGroup",
    "Status",
]

Dims = tuple[str, ...]


class CreateDeviceMesh(NamedTuple):
    result: Any
    names: Dims
    ranks: Any


class CreateStream(NamedTuple):
    result: Any
    default: bool


class CreateRemoteProcessGroup(NamedTuple):
    result: Any
    device_mesh: Any
    dims: Dims


class CallFunction(NamedTuple):
    ident: int
    result: object  # pytree with tensors in it
    mutates: tuple[Any, ...]
    function: Any
    args: tuple[object, ...]
    kwargs: dict[str, object]
    stream: Any
    device_mesh: Any
    remote_process_groups: list[Any]


class Exit(NamedTuple):
    destroy_pg: bool
    error: BaseException | None


class CommandGroup(NamedTuple):
    commands: list[Any]


class RecordingFormal(NamedTuple):
    result: Any
    argument_index: int
    stream: Any


class RecordingResult(NamedTuple):
    input: Any
    output_index: int
    stream: Any


class DefineRecording(NamedTuple):
    result: Any
    nresults: int
    nformals: int
    commands: list[Any]
    ntotal_messages: int
    message_index: int


class CallRecording(NamedTuple):
    ident: int
    recording: Any
    results: list[Any]
    actuals: list[Any]


class DeleteRefs(NamedTuple):
    refs: list[int]


class Restarted(NamedTuple):
    result: int


class SendValue(NamedTuple):
    ident: int
    destination: Any  # the pipe to send the result along; None: to the controller
    mutates: tuple[Any, ...]
    function: Any  # None is the identity
    args: tuple[object, ...]
    kwargs: dict[str, object]
    stream: Any


class FetchResult(NamedTuple):
    ident: int
    value: object


class RemoteFunctionFailed(NamedTuple):
    failing_ident: int
    stack_offset: int
    exception: Exception
    worker_frames: list[FrameSummary]


class InternalException(NamedTuple):
    exception: Exception
    frames: list[FrameSummary]


class RemoteGeneratorFailed(NamedTuple):
    exception: Exception
    frames: list[FrameSummary]


class Status(NamedTuple):
    first_uncompleted_ident: int


class RequestStatus(NamedTuple):
    ident: int
    controller: bool


class BorrowCreate(NamedTuple):
    result: Any
    borrow: int
    tensor: Any
    from_stream: Any
    to_stream: Any


class BorrowDrop(NamedTuple):
    borrow: int


class BorrowFirstUse(NamedTuple):
    borrow: int


class BorrowLastUse(NamedTuple):
    borrow: int


class SendTensor(NamedTuple):
    result: Any
    from_ranks: Any
    to_ranks: Any
    tensor: Any
    factory: Any
    from_stream: Any
    to_stream: Any


class SendResultOfActorCall(NamedTuple):
    seq: int
    broker_id: tuple[str, int]
    local_state: Any
    mutates: list[Any]
    stream: Any


class CallActorMethod(NamedTuple):
    seq: int
    result: object
    broker_id: tuple[str, int]
    local_state: Any
    mutates: list[Any]
    stream: Any


class SplitComm(NamedTuple):
    dims: Dims
    device_mesh: Any
    stream: Any


class SplitCommForProcessGroup(NamedTuple):
    remote_process_group: Any
    stream: Any


class Reduce(NamedTuple):
    result: Any
    local_tensor: Any
    factory: Any
    source_mesh: Any
    stream: Any
    dims: Dims
    reduction: str
    scatter: bool
    inplace: bool
    out: Any


class CreatePipe(NamedTuple):
    result: Any
    key: str
    function: Any
    max_messages: int
    device_mesh: Any
    args: tuple[object, ...]
    kwargs: dict[str, object]


class PipeRecv(NamedTuple):
    ident: int
    result: object
    pipe: Any
    stream: Any


class BackendNetworkInit(NamedTuple):
    hostname: str | None = None
    port: int | None = None


class BackendNetworkPointToPointInit(NamedTuple):
    from_stream: Any
    to_stream: Any


class DebuggerRead(NamedTuple):
    requested: int


class DebuggerWrite(NamedTuple):
    payload: bytes


class DebuggerMessage(NamedTuple):
    stream_id: int
    action: Literal["paused", "attach", "detach"] | DebuggerRead | DebuggerWrite


class DependentOnError(Exception):
    """A value that depended on invocation ``ident``, which failed."""

    def __init__(self, ident: int) -> None:
        super().__init__(ident)
        self.ident = ident
