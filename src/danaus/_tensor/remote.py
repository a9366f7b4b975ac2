"""``remote``: run your own function on every proc's local shards, from the client.

``remote(fn, propagate=...)`` wraps a function (or ``"module.fn"``, a torch
operator, or whatever one of ``function.resolvers`` accepts); calling the
wrapper under an active mesh returns mesh tensors at once, with shapes from
``propagate`` run on meta tensors (or ``fn`` itself when omitted or
``"cached"``; ``"inspect"``: no tensor results, the call returns ``None``). The
adverbs ``call``/``call_one``/``broadcast`` return the function's plain
results to the client instead. Arguments that ``propagate`` writes in place
(seen through meta tensors' version counters) count as mutated, so a failure
in ``fn`` fails them too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, overload

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from .._actor.core.future import Future
from .client import active_mesh, same_mesh
from .coalescing import check_not_coalescing
from .engine import engine_for
from .fetch import _shard_rank
from .function import resolvable_function, resolve_function, target_name
from .groups import RemoteProcessGroup, dummy_for, forget_dummy
from .messages import Ref, RunRemote
from .opaque_ref import propagating
from .stream import check_use
from .tensor import Tensor

if TYPE_CHECKING:
    from .._actor.api.procs import ProcMesh
    from .engine import Engine

Propagator = Literal["cached", "inspect", "mocked"] | Callable[..., Any] | None
_PROPAGATORS = ("cached", "inspect", "mocked")

__all__ = [
    "Propagator",
    "Remote",
    "call_on_shard_and_fetch",
    "new_handles",
    "remote",
    "resolve_function",
    "run_propagate",
]


def run_propagate(prop: Any, flat: list[Any], spec: Any) -> tuple[list[Any], Any, list[bool]]:
    """``prop`` run in local torch on meta copies of the mesh tensors among ``flat`` (the
    flattened arguments, ``spec`` their structure): its result flattened, with its
    tensors as meta tensors; the result's structure; for each argument, whether
    ``prop`` wrote it in place (a mesh tensor whose meta copy's version moved)."""
    with _disable_current_modes(), propagating():
        # a process group is a dummy here: propagate runs on the client, on meta tensors
        meta_flat = [x._meta.clone() if isinstance(x, Tensor) else dummy_for(x) for x in flat]
        versions = [m._version if isinstance(m, torch.Tensor) else None for m in meta_flat]
        margs, mkwargs = pytree.tree_unflatten(meta_flat, spec)
        try:
            out = prop(*margs, **mkwargs)
        finally:
            for m in meta_flat:
                forget_dummy(m)
        out_flat, out_spec = pytree.tree_flatten(out)
        out_flat = [
            x if not isinstance(x, torch.Tensor) or x.device.type == "meta" else x.to("meta")
            for x in out_flat
        ]
    written = [
        isinstance(x, Tensor) and m._version != v
        for x, m, v in zip(flat, meta_flat, versions, strict=True)
    ]
    return out_flat, out_spec, written


def new_handles(
    out_flat: list[Any], mesh: ProcMesh, engine: Engine, device: Any, stream: Any = None
) -> tuple[list[Any], list[int]]:
    """A new mesh tensor for each meta tensor of ``out_flat`` (other leaves kept as they
    are), and their ids in order: what a worker defines from the real result."""
    results: list[Any] = []
    outs: list[int] = []
    for x in out_flat:
        if isinstance(x, torch.Tensor):
            h = Tensor(x, mesh, engine, device, stream)
            outs.append(h._ref)
            results.append(h)
        else:
            results.append(x)
    return results, outs


class Remote:
    """A function that runs on every proc of the active mesh. Made by
    `remote()`."""

    def __init__(self, fn: Any, propagate: Any) -> None:
        resolvable_function(fn)  # ValueError now for a target no resolver takes
        if propagate is not None and propagate not in _PROPAGATORS and not callable(propagate):
            raise ValueError(
                f"remote({target_name(fn)}, propagate={propagate!r}): propagate must be None, "
                f"one of {list(_PROPAGATORS)} or a function computing the result from meta "
                "tensors"
            )
        self._fn = fn
        self._remote_impl = fn  # how a path resolver finds the function behind this wrapper
        self._propagate = propagate
        self._resolved: Any = None  # the resolvable, at first use (the module is bound then)
        if callable(fn):
            functools.update_wrapper(self, fn)

    @property
    def _name(self) -> str:
        return target_name(self._fn)

    @property
    def _target(self) -> Any:
        """What the workers resolve: the first answer of ``function_resolvers``, kept."""
        r = self._resolved
        if r is None:
            r = self._resolved = resolvable_function(self._fn)
        return r

    def _prepare(
        self, args: Any, kwargs: Any
    ) -> tuple[Any, Any, list[Tensor], Any, list[RemoteProcessGroup]]:
        mesh = active_mesh()
        if mesh is None:
            raise ValueError(
                f"calling remote function {self._name} requires an active mesh "
                "(`with proc_mesh.activate():`)"
            )
        flat, spec = pytree.tree_flatten((args, kwargs))
        handles: list[Tensor] = []
        groups: list[RemoteProcessGroup] = []
        wire = list(flat)
        for i, x in enumerate(flat):
            if isinstance(x, Tensor):
                if not same_mesh(x._mesh, mesh):
                    raise ValueError(
                        f"remote {self._name}: a tensor on mesh {x._mesh!r} was passed while "
                        f"mesh {mesh!r} is active; move it with t.to_mesh(...)"
                    )
                handles.append(x)
                wire[i] = Ref(x._ref)
            elif isinstance(x, torch.Tensor):
                raise ValueError(
                    f"remote {self._name}: a local tensor of shape {list(x.shape)} was passed "
                    "while a mesh is active; create it under the mesh instead"
                )
            elif isinstance(x, RemoteProcessGroup):
                if not same_mesh(x.device_mesh, mesh):
                    raise ValueError(
                        f"remote {self._name}: {x!r} was passed while mesh {mesh!r} is active; "
                        "make the process group from the active mesh (mesh.process_group(...))"
                    )
                groups.append(x)
                wire[i] = x._wire()
        check_use(f"remote {self._name}", handles)
        return mesh, pytree.tree_unflatten(wire, spec), handles, (flat, spec), groups

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run on every proc of the active mesh; returns mesh tensors at once. Never blocks.

        Raises ``ValueError`` without an active mesh or for tensors of another
        mesh, and whatever ``propagate`` raises on the client.
        """
        mesh, (wargs, wkwargs), handles, (flat, spec), groups = self._prepare(args, kwargs)
        engine = engine_for(mesh)
        prop = self._propagate
        if prop == "inspect":  # no tensor results and nothing written: the call returns None
            engine.send(mesh._shape, RunRemote(self._target, wargs, wkwargs, (), (), bool(groups)))
            return None
        if prop == "mocked":
            raise NotImplementedError(
                f"remote {self._name}: mocked propagation is not implemented (as in Monarch)"
            )
        if prop is None or prop == "cached":
            prop = resolve_function(self._target)
        out_flat, out_spec, written = run_propagate(prop, flat, spec)
        mutates = tuple(x._ref for x, w in zip(flat, written, strict=True) if w)
        check_use(
            f"remote {self._name}", [], [x for x in flat if getattr(x, "_ref", None) in mutates]
        )
        device = handles[0].device if handles else engine.device
        results, outs = new_handles(out_flat, mesh, engine, device)
        cmd = RunRemote(self._target, wargs, wkwargs, tuple(outs), mutates, bool(groups))
        engine.send(mesh._shape, cmd)
        return pytree.tree_unflatten(results, out_spec)

    rref = __call__

    def _endpoint(
        self, args: Any, kwargs: Any, shape: Any = None, one: bool = False
    ) -> tuple[Any, Any, Any]:
        """(engine, the workers' ``call_remote`` endpoint for ``shape``, its arguments).

        ``one``: only one proc of the mesh runs the function (as with ``shape``).
        """
        check_not_coalescing("fetching a remote function's results")
        mesh, (wargs, wkwargs), _, _, groups = self._prepare(args, kwargs)
        if one or shape is not None:  # one proc runs it: its groups would wait for the rest
            for g in groups:
                if g.size() > 1:
                    raise ValueError(
                        f"remote {self._name}: {g!r} spans {g.size()} procs but only one proc "
                        "runs the function here, so its collectives would wait forever; call "
                        "the function on every proc (fn.call(...)) or use a group of one proc"
                    )
        engine = engine_for(mesh)
        engine.check()
        engine.flush()
        a = (self._target, wargs, wkwargs, bool(groups))
        return engine, engine.targets(shape or mesh._shape).call_remote, a

    def call(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run on every proc; the future holds a ``ValueMesh`` of the results. Never blocks."""
        engine, ep, a = self._endpoint(args, kwargs)
        with engine.as_owner():
            return ep.call(*a)  # type: ignore[no-any-return]

    def call_one(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run on the one proc of a one-proc active mesh; the future holds its result.

        Never blocks; raises ``ValueError`` if the active mesh has several procs.
        """
        engine, ep, a = self._endpoint(args, kwargs)
        with engine.as_owner():
            return ep.call_one(*a)  # type: ignore[no-any-return]

    def _send_to_port(self, args: Any, kwargs: Any, port: Any, selection: str) -> None:
        """``send(fn, args, kwargs, port=...)``: each proc's result to ``port``. Never blocks."""
        engine, ep, a = self._endpoint(args, kwargs, one=selection == "choose")
        with engine.as_owner():
            ep._send_to_port(a, {}, port, selection)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Run on every proc and discard the results. Never blocks."""
        mesh, (wargs, wkwargs), _, _, groups = self._prepare(args, kwargs)
        cmd = RunRemote(self._target, wargs, wkwargs, (), (), bool(groups))
        engine_for(mesh).send(mesh._shape, cmd)

    def __repr__(self) -> str:
        return f"<remote {self._name}>"


@overload
def remote(fn: None = None, *, propagate: Propagator = None) -> Callable[[Any], Remote]: ...


@overload
def remote(fn: Any, *, propagate: Propagator = None) -> Remote: ...


def remote(fn: Any = None, *, propagate: Propagator = None) -> Any:
    """Wrap ``fn`` (a function, a torch operator or ``"module.fn"``) to run on every proc
    of the active mesh.

    Usable as ``@remote``, ``@remote(propagate=...)`` or ``remote("pkg.fn",
    propagate=...)``. ``propagate`` computes the result's shapes from meta
    tensors; when omitted (or ``"cached"``), ``fn`` itself runs on meta tensors
    on the client; ``"inspect"`` says the function returns no tensors (calling
    it returns ``None``; ``call``/``call_one`` still bring its values back);
    ``"mocked"`` raises ``NotImplementedError`` when called, as in Monarch.
    The workers get what the first of ``danaus.function_resolvers`` to accept
    ``fn`` makes of it. Never blocks. Raises ``ValueError`` for a target
    no resolver accepts, or a ``propagate`` that is none of the above.
    """
    if fn is None:
        return functools.partial(remote, propagate=propagate)
    return Remote(fn, propagate)


def call_on_shard_and_fetch(
    fn: Remote, *args: Any, shard: dict[str, int] | None = None, **kwargs: Any
) -> Future[Any]:
    """Run remote ``fn`` on one proc of the active mesh (coordinate 0 where not given).

    Returns a future of its result, moved to the client. Never blocks.
    Raises ``ValueError`` without an active mesh or for unknown coordinates.
    """
    mesh = active_mesh()
    if mesh is None:
        raise ValueError("call_on_shard_and_fetch requires an active mesh")
    engine, ep, a = fn._endpoint(args, kwargs, _shard_rank(mesh, shard, {}))
    with engine.as_owner():
        return ep.call_one(*a)  # type: ignore[no-any-return]
