"""``Tensor``: a handle to a tensor sharded over a proc mesh, and the dispatch of torch ops on it.

A ``Tensor`` is a torch wrapper subclass with no storage: its sizes, dtype
and device are real, its values live on the workers (``ref`` names them).
Every torch op that reaches `dispatch()` (through the active mesh's
dispatch mode or the subclass's ``__torch_dispatch__``) is first run on
meta tensors here, so a shape or dtype error raises on the client, at the
op, before anything is sent; then the op is sent to the mesh's workers and
its results come back as new handles at once. Autograd runs above dispatch,
on the client, so ``loss.backward()`` sends the backward ops the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from .._actor.core import handoff
from .actors import ACTOR_ARGS
from .client import active_mesh, same_mesh
from .engine import Engine, engine_for
from .messages import CallOp, Ref
from .stream import Storage, Stream, check_use, get_active_stream

if TYPE_CHECKING:
    from .._actor.api.procs import ProcMesh

__all__ = ["Tensor", "dispatch", "implement", "meta_empty", "meta_like"]


def meta_empty(shape: Any, dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor made outside any dispatch mode (so not itself sent to a mesh)."""
    with _disable_current_modes():
        return torch.empty(shape, dtype=dtype, device="meta")


def meta_like(m: torch.Tensor) -> torch.Tensor:
    """A new meta tensor with ``m``'s sizes, strides and dtype (its own storage)."""
    with _disable_current_modes():
        return torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device="meta")


# Ops that would need a shard's values on the client: they raise with advice instead.
_VALUE_OPS = {
    "aten::_local_scalar_dense",
    "aten::is_nonzero",
    "aten::equal",
    "aten::allclose",
}
# Ops that bring a local tensor's value onto the mesh (``torch.tensor(...)`` under a mesh).
_LIFT_OPS = {"aten::lift_fresh", "aten::lift_fresh_copy", "aten::lift"}

_EXPLAIN_LOCAL = (
    "A local (non-distributed) tensor was used while device mesh {mesh!r} is active: {desc}. "
    "Create it under the mesh (inside `with mesh.activate():`), compute locally inside "
    "`with danaus.no_mesh.activate():`, or move it with `danaus.to_mesh`."
)
_EXPLAIN_WRONG = (
    "a tensor on mesh {theirs!r} was used while mesh {mesh!r} is active. Use "
    "`with {theirs_short}.activate():` for ops on it, or move it with `t.to_mesh(mesh)`."
)


# What ``Tensor``'s methods ``reduce``/``reduce_`` and ``to_mesh``/``slice_mesh`` run: the
# functions of ``collectives`` and ``movement``, modules above this one (they make tensors),
# each registering its own when imported; ``api``, through which every program reaches the
# tensor engine, imports both. A table built at import, like the ops' caches below.
_METHODS: dict[str, Callable[..., Any]] = {}


def implement(method: str, fn: Callable[..., Any]) -> None:
    """Make ``fn(tensor, ...)`` the work of ``Tensor.<method>`` (for the module that owns it)."""
    if method not in ("reduce", "to_mesh", "slice_mesh"):
        raise ValueError(f"Tensor has no method {method!r} implemented elsewhere")
    _METHODS[method] = fn


class Tensor(torch.Tensor):
    """A tensor whose shards live on the procs of a mesh; made by torch ops under a mesh.

    Sizes, dtype and device are known on the client at once; the values are
    fetched with ``danaus.inspect(t)`` or ``danaus.fetch_shard(t)``.
    """

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]
    _m: torch.Tensor | None
    _ref: int
    _mesh: Any
    _engine: Engine
    _stream: Stream  # the stream it was made on; ops on it run there
    _storage: Storage  # shared with its views on its stream: the borrow rules' state

    @staticmethod
    def __new__(
        cls,
        meta: Any,
        mesh: ProcMesh,
        engine: Engine,
        device: Any,
        stream: Stream | None = None,
    ) -> Tensor:
        """``meta`` is a meta tensor, or ``(sizes, strides, dtype)`` to make one when needed."""
        if isinstance(meta, torch.Tensor):
            size, stride, offset, dtype = (
                meta.size(),
                meta.stride(),
                meta.storage_offset(),
                meta.dtype,
            )
        else:
            (size, stride, dtype), offset, meta = meta, 0, None
        t = torch.Tensor._make_wrapper_subclass(
            cls,
            size,
            strides=stride,
            storage_offset=offset,
            dtype=dtype,
            layout=torch.strided,
            device=device,
            requires_grad=False,
        )
        ref = engine.new_id()
        t._m = meta
        t._ref = ref
        t._mesh = mesh
        t._engine = engine
        t._stream = stream = stream or get_active_stream()
        t._storage = Storage()
        engine.track(t, ref, stream.name)
        return t

    @property
    def _meta(self) -> torch.Tensor:
        """A meta tensor with this tensor's sizes, strides and dtype (made at first use)."""
        m = self._m
        if m is None:
            with _disable_current_modes():
                m = self._m = torch.empty_strided(
                    self.shape, self.stride(), dtype=self.dtype, device="meta"
                )
        return m

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        return dispatch(func, args, kwargs or {}, active_mesh())

    @property
    def mesh(self) -> Any:
        """The proc mesh this tensor's shards live on."""
        return self._mesh

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        grad = ", requires_grad=True" if self.requires_grad else ""
        stream = "" if self._stream.default else f", stream={self._stream.name!r}"
        return (
            f"danaus.Tensor(shape={list(self.shape)}, dtype={self.dtype}, "
            f"device={self.device}, mesh={self._mesh!r}{stream}{grad})"
        )

    def reduce(
        self,
        dims: Any,
        reduction: str = "sum",
        scatter: bool = False,
        mesh: ProcMesh | None = None,
        _inplace: bool = False,
    ) -> Tensor:
        """Collective over mesh dimensions ``dims``; see `danaus.reduce()`. Never
        blocks."""
        out: Tensor = _METHODS["reduce"](self, dims, reduction, scatter, mesh, _inplace)
        return out

    def to_mesh(self, mesh: ProcMesh) -> Tensor:
        """This tensor's values on ``mesh``; see `danaus.to_mesh()`. Never
        blocks."""
        out: Tensor = _METHODS["to_mesh"](self, mesh)
        return out

    def slice_mesh(self, **coords: Any) -> Any:
        """This tensor seen on ``self.mesh.slice(**coords)``, ready for ``.to_mesh(m)``."""
        return _METHODS["slice_mesh"](self, **coords)

    def reduce_(
        self, dims: Any, reduction: str = "sum", scatter: bool = False, mesh: ProcMesh | None = None
    ) -> Tensor:
        """In-place `reduce()`: the result overwrites this tensor. Never blocks."""
        out: Tensor = _METHODS["reduce"](self, dims, reduction, scatter, mesh, True)
        return out

    def _view_on(self, stream: Stream) -> Tensor:
        """A new handle of this tensor's sizes, strides and dtype on ``stream`` (a borrow's)."""
        return Tensor(meta_like(self._meta), self._mesh, self._engine, self.device, stream=stream)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled only as an actor endpoint's argument: the receiving proc's local shard."""
        r = handoff.refer(self, ACTOR_ARGS)
        if r is None:
            raise TypeError(
                f"{self!r} cannot be pickled: its values live on the workers of its mesh. "
                "Pass it as an argument of an actor endpoint on the same procs (the actor gets "
                "its local shard), or fetch its values with danaus.inspect(t) / "
                "danaus.fetch_shard(t)"
            )
        return r


def _describe(t: torch.Tensor) -> str:
    return f"tensor of shape {list(t.shape)} and dtype {t.dtype} on {t.device}"


# Result metadata of ops by (op, inputs' metadata, other arguments): a repeated op (a
# training step's) skips running on meta tensors. A miss runs the op on meta tensors,
# which raises a shape or dtype error; only what succeeded is remembered, so an error
# is never skipped. In-place ops are remembered too (their results are their inputs),
# unless they change an input's sizes or strides (``t_()``, ``resize_()``).
_META_CACHE: dict[Any, Any] = {}  # a per-process cache, not state: ops give the same results
_META_CACHE_MAX = 8192
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout)
# a cache entry's leaves: a plain value, a new tensor's (sizes, strides, dtype), an input
_VALUE, _NEW, _INPUT = 0, 1, 2


def _cache_key(func: str, flat: list[Any], spec: Any) -> Any:
    """A hashable key for the op named ``func`` applied to ``flat``; ``None``: not cacheable.

    Each mesh tensor contributes its sizes, strides, storage offset, dtype and
    device, and its position among the tensors seen before (so ``x + x`` and
    ``x + y`` are told apart); other leaves their type and value.
    """
    # the op's name, not the op: the name is unique per overload and hashes in C
    parts: list[Any] = [func, spec, torch.get_default_dtype()]
    seen: list[Tensor] = []
    for x in flat:
        if isinstance(x, Tensor):
            alias = -1
            for j, s in enumerate(seen):
                if s is x:
                    alias = j
                    break
            seen.append(x)
            parts.append((tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x.device, alias))
        elif isinstance(x, torch.Tensor):
            return None
        elif type(x) in _PLAIN or isinstance(x, torch.memory_format):
            parts.append((type(x), x))
        else:
            return None
    return tuple(parts)


def _to_cache(key: Any, leaves: list[Any], spec: Any, inputs: dict[int, int]) -> None:
    """Remember an op's results (``spec`` ``None``: a single tensor).

    ``inputs`` maps ``id`` of an input's meta tensor to its position among the
    op's leaves: a result that is an input is remembered as that position.
    """
    entry: list[tuple[int, Any]] = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            i = inputs.get(id(x))
            if i is not None:
                entry.append((_INPUT, i))
            elif x.storage_offset() != 0 or x.device.type != "meta":
                return  # an offset view: recompute each time
            else:
                entry.append((_NEW, (tuple(x.shape), x.stride(), x.dtype)))
        elif type(x) in _PLAIN:
            entry.append((_VALUE, x))
        else:
            return
    if len(_META_CACHE) >= _META_CACHE_MAX:
        _META_CACHE.clear()
    _META_CACHE[key] = (entry, spec)


# A per-process cache, not state (as the ones below): what each op's schema says.
_MUTATES: dict[Any, tuple[tuple[int, str], ...]] = {}


def _mutated_args(func: Any) -> tuple[tuple[int, str], ...]:
    """(position, name) of the arguments ``func`` writes in place, from its schema."""
    m = _MUTATES.get(func)
    if m is None:
        m = tuple(
            (i, a.name)
            for i, a in enumerate(func._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
        _MUTATES[func] = m
    return m


_ALIASING: dict[Any, bool] = {}  # a cache: whether each op returns a view (its schema)


def _returns_alias(func: Any) -> bool:
    """Whether ``func`` returns a view of an input (its schema says so)."""
    r = _ALIASING.get(func)
    if r is None:
        r = _ALIASING[func] = any(x.alias_info is not None for x in func._schema.returns)
    return r


_NESTED = (tuple, list, dict)
_SEQ = (tuple, list)


def _flatten(args: Any, kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
    """``(args, kwargs)``'s leaves and how to rebuild them.

    Fast paths for what ops take: plain arguments, and lists or tuples of plain
    leaves (sizes, ``_foreach`` tensor lists); anything deeper goes through pytree.
    """
    vals = (*args, *kwargs.values())
    for v in vals:
        if type(v) in _NESTED:
            break
    else:
        return list(vals), ("flat", len(args), tuple(kwargs), None)
    flat: list[Any] = []
    layout: list[Any] = []
    for v in vals:
        tv = type(v)
        if tv in _SEQ:
            for x in v:
                if type(x) in _NESTED:
                    return pytree.tree_flatten((args, kwargs))
            flat.extend(v)
            layout.append((tv, len(v)))
        elif tv is dict:
            return pytree.tree_flatten((args, kwargs))
        else:
            flat.append(v)
            layout.append(None)
    return flat, ("flat", len(args), tuple(kwargs), tuple(layout))


def _unflatten(flat: list[Any], spec: Any) -> Any:
    if type(spec) is tuple:
        n, keys, layout = spec[1], spec[2], spec[3]
        if layout is None:
            vals = flat
        else:
            vals = []
            i = 0
            for item in layout:
                if item is None:
                    vals.append(flat[i])
                    i += 1
                else:
                    ctor, k = item
                    vals.append(ctor(flat[i : i + k]))
                    i += k
        return tuple(vals[:n]), dict(zip(keys, vals[n:], strict=True))
    return pytree.tree_unflatten(flat, spec)


def _mutated_handles(func: Any, args: Any, kwargs: dict[str, Any]) -> list[Tensor]:
    """The mesh tensors ``func`` writes in place (from its schema)."""
    out: list[Tensor] = []
    for pos, arg_name in _mutated_args(func):
        v = args[pos] if pos < len(args) else kwargs.get(arg_name)
        if isinstance(v, Tensor):
            out.append(v)
        elif isinstance(v, _SEQ):
            out.extend(x for x in v if isinstance(x, Tensor))
    return out


_OP_INFO: dict[Any, tuple[str, bool]] = {}  # a cache: each op's name and whether it mutates


def _op_info(func: Any) -> tuple[str, bool]:
    """``func``'s name and whether it is mutable, looked up once per op."""
    info = _OP_INFO.get(func)
    if info is None:
        info = _OP_INFO[func] = (func.name(), func._schema.is_mutable)
    return info


def dispatch(func: Any, args: Any, kwargs: dict[str, Any], mesh: ProcMesh) -> Any:
    """Run torch op ``func`` for the active ``mesh``: propagate metadata, send, return handles.

    Never blocks. Raises the torch error of a shape or dtype mismatch (before
    sending), ``ValueError`` for a local tensor or a tensor of another mesh,
    ``RuntimeError`` for an op that needs values on the client (``.item()``).
    """
    name, mutable = _op_info(func)
    flat, spec = _flatten(args, kwargs)
    handles: list[tuple[int, Tensor]] = []
    local = False
    for i, x in enumerate(flat):
        if isinstance(x, Tensor):
            handles.append((i, x))
        elif isinstance(x, torch.Tensor):
            local = True
    if mesh is None:
        if not handles:
            return func(*args, **kwargs)
        # No active mesh (or no_mesh): the op runs on its tensors' mesh, as Monarch's
        # (which takes the mesh of the first distributed tensor before the ambient one).
        mesh = handles[0][1]._mesh
    if (
        local
        and not handles
        and all(getattr(x, "_danaus_fetched", False) for x in flat if isinstance(x, torch.Tensor))
    ):
        # values fetched from a mesh (and what is computed from them alone) stay usable
        # here, so `print(danaus.inspect(t))` works under an active mesh
        with _disable_current_modes():
            out = func(*args, **kwargs)
        for x in pytree.tree_leaves(out):
            if isinstance(x, torch.Tensor):
                x._danaus_fetched = True  # type: ignore[attr-defined]
        return out
    if local and name not in _LIFT_OPS:
        bad = next(x for x in flat if isinstance(x, torch.Tensor) and not isinstance(x, Tensor))
        raise ValueError(_EXPLAIN_LOCAL.format(mesh=mesh, desc=f"{name} got a {_describe(bad)}"))
    for _, t in handles:
        if not same_mesh(t._mesh, mesh):
            raise ValueError(
                f"{name}: "
                + _EXPLAIN_WRONG.format(theirs=t._mesh, mesh=mesh, theirs_short="other_mesh")
            )
    if name in _VALUE_OPS:
        raise RuntimeError(
            f"{name} needs the value of a distributed tensor on the client (for example "
            "`.item()`, `bool(t)`, `float(t)`, `torch.equal`); fetch it instead with "
            "`danaus.inspect(t)` (blocks) or `danaus.fetch_shard(t)` (a future)"
        )
    mutated = _mutated_handles(func, args, kwargs) if mutable else []
    stream = get_active_stream()
    if handles:
        check_use(name, [t for _, t in handles], mutated, stream)
    engine = engine_for(mesh)
    device = kwargs.get("device")
    if device is None:
        device = handles[0][1].device if handles else engine.device
    if not isinstance(device, torch.device):
        device = torch.device(device)
    key = None if name in _LIFT_OPS else _cache_key(name, flat, spec)
    cached = _META_CACHE.get(key) if key is not None else None
    outs: list[int | None] = []
    results: list[Any] = []
    if cached is not None:  # a repeated op: no meta tensors at all
        entry, out_spec = cached
        for kind, v in entry:
            if kind == _NEW:
                h = Tensor(v, mesh, engine, device, stream)
                outs.append(h._ref)
                results.append(h)
            elif kind == _INPUT:  # an in-place op returns its input
                outs.append(None)
                results.append(flat[v])
            else:
                results.append(v)
        if not outs and not mutable:
            return pytree.tree_unflatten(results, out_spec)
    else:
        # metadata on the client: the same op on meta tensors
        meta_flat = list(flat)
        by_meta: dict[int, Tensor] = {}
        positions: dict[int, int] = {}
        for i, t in handles:
            m = meta_flat[i] = t._meta
            by_meta[id(m)] = t
            positions[id(m)] = i
        margs, mkwargs = _unflatten(meta_flat, spec)
        if "device" in mkwargs:
            mkwargs = {**mkwargs, "device": "meta"}
        if name in _LIFT_OPS:
            margs = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in margs)
        try:
            out = func(*margs, **mkwargs)
        except NotImplementedError as e:
            raise NotImplementedError(
                f"{name} cannot run on a distributed tensor: its result's shape depends on the "
                f"values ({e}). Fetch the values with danaus.inspect(t) and compute locally."
            ) from None
        if isinstance(out, torch.Tensor):
            out_flat, out_spec = [out], None
        else:
            out_flat, out_spec = pytree.tree_flatten(out)
        if key is not None and all(_same_metadata(t) for t in mutated):
            _to_cache(key, out_flat, out_spec, positions)
        if not any(isinstance(x, torch.Tensor) for x in out_flat) and not mutable:
            return out  # metadata only (sizes, strides, is_same_size): nothing to send
        for x in out_flat:
            if isinstance(x, torch.Tensor):
                same = by_meta.get(id(x))
                if same is not None:  # an in-place op returns its input
                    outs.append(None)
                    results.append(same)
                    continue
                h = Tensor(x, mesh, engine, device, stream)
                outs.append(h._ref)
                results.append(h)
            else:
                results.append(x)
    if handles and _returns_alias(func):  # a view shares its input's storage (borrow rules)
        storage = handles[0][1]._storage
        for r in results:
            if isinstance(r, Tensor):
                r._storage = storage
    wire_flat = list(flat)
    for i, t in handles:
        wire_flat[i] = Ref(t._ref)
    wargs, wkwargs = _unflatten(wire_flat, spec)
    engine.send(
        mesh._shape,
        CallOp(name, wargs, wkwargs, tuple(outs), tuple(t._ref for t in mutated), not handles),
        stream=stream.name,
    )
    if out_spec is None:
        return results[0]
    return pytree.tree_unflatten(results, out_spec)


def _same_metadata(t: Tensor) -> bool:
    """Whether ``t``'s meta tensor still has its sizes and strides (not ``t_()``, ``resize_()``)."""
    m = t._meta
    return bool(
        m.shape == t.shape and m.stride() == t.stride() and m.storage_offset() == t.storage_offset()
    )
