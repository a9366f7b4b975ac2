"""A simulated mesh of procs (``SimulatedMesh``), its activation, and the meta
device that stands in for CUDA while a simulated mesh is active."""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .._actor.api.procs import ProcMesh, _ProcState
from .._actor.core.future import Future
from .._mesh import Shape
from .refs import _META

__all__ = ["SimActivation", "SimulatedMesh", "allow_simulated_cuda"]


def _as_meta(x: Any) -> Any:
    if isinstance(x, torch.device) and x.type == "cuda":
        return _META
    if isinstance(x, str) and (x == "cuda" or x.startswith("cuda:")):
        return "meta"
    return x


class _CudaAsMeta(TorchFunctionMode):
    """While a simulated mesh is active on a machine without CUDA: ``"cuda"`` names
    its simulated GPUs, whose tensors are on ``meta`` on the client."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0].to(_META)
        args = tuple(_as_meta(a) for a in args)
        kwargs = {k: _as_meta(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


class SimActivation:
    """A simulated mesh's activation: the tensor engine's, plus ``_CudaAsMeta`` where
    torch has no CUDA. Already in effect; ``with`` or ``close()`` ends it."""

    def __init__(self, act: Any, registry: list[Any]) -> None:
        self._act = act
        self.mesh = act.mesh
        self._registry = registry  # the open activations of the simulation
        registry.append(self)
        self._mode: _CudaAsMeta | None = None
        if not torch.cuda.is_available():
            self._mode = _CudaAsMeta()
            self._mode.__enter__()  # type: ignore[no-untyped-call]

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        if self in self._registry:
            self._registry.remove(self)
        self._act.close()


_cuda_names_ok = [False]


def allow_simulated_cuda() -> None:
    """Let ``device="cuda"`` name a simulated GPU on a machine without CUDA.

    torch initialises CUDA before a factory with ``device="cuda"`` reaches the
    mesh's dispatch (which never makes a CUDA tensor); without CUDA that
    raises. Here torch's one-time CUDA initialisation is marked done, so the
    name passes; a real CUDA tensor made afterwards still fails ("Could not
    run ... from the 'CUDA' backend"). Does nothing where CUDA is available.
    """
    if _cuda_names_ok[0] or torch.cuda.is_available():
        return
    cuda: Any = torch.cuda
    prev = cuda._initialized
    cuda._initialized = True
    try:
        torch.empty(0, device="cuda")  # runs torch's C++ lazy init, which now passes
    except Exception:
        pass
    finally:
        cuda._initialized = prev
    _cuda_names_ok[0] = True


class SimulatedMesh(ProcMesh):
    """A ``ProcMesh`` of simulated procs: tensors only (see ``danaus.Simulator``).

    Slices (``mesh(host=0)``, ``mesh.slice(...)``) are simulated meshes too.
    ``exit()`` ends the simulation and writes the trace. Spawning actors on it
    raises ``NotImplementedError``: it has no processes.
    """

    _sim_interface: Any

    def __init__(self, shape: Shape, state: _ProcState, interface: Any, n: int) -> None:
        super().__init__(tuple(range(n)), shape, state, None)  # type: ignore[arg-type]
        self._sim_interface = interface

    def _new_with_shape(self, shape: Shape) -> SimulatedMesh:
        return SimulatedMesh(shape, self._state, self._sim_interface, len(self._procs))

    def activate(self) -> SimActivation:
        """Make this mesh the one torch ops run on (see ``ProcMesh.activate``)."""
        return SimActivation(super().activate(), self._sim_interface._activations)

    def deactivate(self) -> None:
        """End this mesh's latest ``activate()``."""
        for act in reversed(self._sim_interface._activations):
            if act.mesh is self or act.mesh._shape == self._shape:
                act.close()
                return

    def __call__(self, **coords: Any) -> SimulatedMesh:
        """``mesh(host=0)``: the slice at those coordinates (Monarch's device mesh call)."""
        return self.slice(**coords)

    def spawn(self, name: str, Class: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "a simulated mesh has no procs to spawn actors on; it simulates tensor programs "
            "(danaus._actor.tools.simulated simulates large actor meshes)"
        )

    def exit(self) -> None:
        """End the simulation: write the trace (Monarch's ``mesh.exit()``). Idempotent."""
        self._sim_interface._exit()

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        self.exit()
        self._state.stopped = True
        return Future._resolved(None, "the simulated procs to stop")

    def __repr__(self) -> str:
        sizes = dict(zip(self._shape.labels, self._shape.extent.sizes, strict=True))
        return f"<SimulatedMesh {sizes}>"
