"""The active mesh: which proc mesh torch ops on the client go to, and the mode that sends them.

``with mesh.activate():`` (or ``mesh.activate()`` alone, undone by
``mesh.deactivate()``) pushes ``mesh``; ``no_mesh.activate()`` pushes
``None`` (local torch again). The active mesh is process-wide, as in
Monarch, so autograd's backward pass, which torch may run on another
thread, sees the same mesh. While any activation is open on a thread, a
``TorchDispatchMode`` routes every torch op of that thread (factories
included) to `danaus._tensor.tensor.dispatch()`. The stack is part of
the client's tensor-engine state (``client.ClientState``, a part of its
node; ``client.active_mesh()`` reads it, for the modules below this one),
so a new session starts with none. Whether a thread has our mode is
torch's per-thread mode stack itself; the mode counts the activations using
it. A mesh whose shards live on GPUs (setting ``tensor_device``) also gets,
while it is active, a ``TorchFunctionMode`` that gives torch's factories
called without a device that device, so ``torch.zeros(3)`` and a module's
parameters land on each worker's GPU with the shards; an explicit
``device=`` is kept. (The dispatch mode cannot tell: torch fills
``device=cpu`` in before it runs.)
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from . import client
from .client import ClientState, active_mesh, same_mesh
from .engine import engine_for
from .tensor import dispatch

if TYPE_CHECKING:
    from .._actor.api.procs import ProcMesh

__all__ = ["Activation", "activate", "active_mesh", "get_active_mesh", "no_mesh"]


def _state() -> client.ClientState:
    """The client's tensor-engine state (starts the client's node if needed)."""
    return client.state()


def get_active_mesh() -> Any:
    """The proc mesh torch ops currently run on. Does not block.

    Raises ``ValueError`` when no mesh is active (outside any
    ``mesh.activate()``, or inside ``no_mesh.activate()``).
    """
    mesh = active_mesh()
    if mesh is None:
        raise ValueError(
            "no device mesh is active; use `with proc_mesh.activate():` to run torch ops on it"
        )
    return mesh


class _MeshMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Sends torch ops to the active mesh; runs them locally under ``no_mesh``.

    One per thread with open activations, on torch's mode stack of that
    thread; ``users`` counts those activations (of any session: one left open
    when a session ends shares it with the next session's, as two nested
    modes would send each other's meta computations).
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.users = 0
        self.thread = threading.current_thread()
        self._ident = threading.get_ident()

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # no torch.compile wrapper around every op's dispatch: it costs ~10 us

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if threading.get_ident() == self._ident:
            return dispatch(func, args, kwargs or {}, active_mesh())
        # torch runs this for our thread on one of its own (autograd's backward on a device
        # thread inherits our modes): act for our thread, so its coalescing block holds it
        state = client.state_if_started()
        if state is None:
            return dispatch(func, args, kwargs or {}, active_mesh())
        with state.acting_for(self.thread):
            return dispatch(func, args, kwargs or {}, active_mesh())


# torch.tensor and friends carry their data from the client: they are lifted onto the
# mesh as they are, and the worker moves the lifted value to its device.
_FACTORIES = frozenset(_device_constructors()) - {torch.tensor, torch.as_tensor, torch.asarray}


class _DefaultDevice(TorchFunctionMode):
    """While a mesh with GPU shards is active: torch's factories without a device get one."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if (
            func in _FACTORIES
            and kwargs.get("device") is None
            and active_mesh() is not None
            and _thread_mode() is not None  # not local torch: propagate, our own meta work
        ):
            kwargs["device"] = self.device
        return func(*args, **kwargs)


def _thread_mode() -> _MeshMode | None:
    """Our mode on the calling thread's torch mode stack, if there."""
    for mode in reversed(_get_current_dispatch_mode_stack()):
        if isinstance(mode, _MeshMode):
            return mode
    return None


class Activation:
    """An open activation: already in effect; ``with`` or ``close()`` ends it.

    Made by ``ProcMesh.activate()`` and ``no_mesh.activate()``. Activations
    nest and must end in reverse order.
    """

    def __init__(self, mesh: ProcMesh | None) -> None:
        device = None
        if mesh is not None:
            device = engine_for(mesh).device  # spawns the workers now, before the first op
        self.mesh = mesh
        self._closed = False
        # Ends on this node's stack, even after a new session: the mesh's node, or (for
        # ``no_mesh``, which holds none) the user's, looked up.
        self._state = state = mesh._node().part(ClientState) if mesh is not None else _state()
        with state.lock:
            state.stack.append(mesh)
            state.acts.append(self)
            self._index = len(state.stack) - 1
        mode = _thread_mode()
        if mode is None:
            mode = _MeshMode()
            mode.__enter__()  # type: ignore[no-untyped-call]
        mode.users += 1
        self._mode = mode
        self._device_mode: _DefaultDevice | None = None
        if device is not None and device.type != "cpu":
            self._device_mode = _DefaultDevice(device)
            self._device_mode.__enter__()  # type: ignore[no-untyped-call]

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """End this activation (idempotent). Raises ``RuntimeError`` if a later one is open."""
        if self._closed:
            return
        state = self._state
        with state.lock:
            if len(state.stack) != self._index + 1:
                raise RuntimeError(
                    f"activations must end in reverse order: {self.mesh!r} was activated "
                    f"before {state.stack[-1]!r}, which is still active; end that one first"
                )
            state.stack.pop()
            state.acts.pop()
        self._closed = True
        if self._device_mode is not None:
            self._device_mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        mode = self._mode
        mode.users -= 1
        if mode.users == 0:
            mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]


def activate(mesh: ProcMesh) -> Activation:
    """Make ``mesh`` the active mesh at once; returns the activation (a context manager).

    Spawns the mesh's tensor-engine workers on first use (does not wait for
    them). ``with mesh.activate(): ...`` ends it at the block's end;
    ``mesh.deactivate()`` ends the latest activation of ``mesh``.
    """
    return Activation(mesh)


def deactivate(mesh: ProcMesh) -> None:
    """End the latest open activation of ``mesh`` (no-op if none). Does not block."""
    state = mesh._node().part(ClientState)
    with state.lock:
        acts = [a for a in state.acts if same_mesh(a.mesh, mesh)]
    if acts:
        acts[-1].close()


class _NoMesh:
    """``with no_mesh.activate():`` runs torch ops locally inside an active mesh."""

    def activate(self) -> Activation:
        """Make no mesh active until the block ends (local torch). Does not block."""
        return Activation(None)

    def __repr__(self) -> str:
        return "no_mesh"


no_mesh = _NoMesh()
