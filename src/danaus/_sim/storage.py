"""The client's side of the simulated memory: each ref's spec, its client handle, and
the storage it shares with its views, so the simulator charges a storage's bytes once
however many refs (a tensor and its views) name it."""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from .._tensor.messages import Ref
from .costs import TensorSpec
from .refs import _is_ref


class RefTable:
    """The refs the engine has seen (``track``) and not yet forgotten (``forget``)."""

    def __init__(self) -> None:
        self.spec: dict[int, TensorSpec] = {}
        self._handles: dict[int, Any] = {}  # id -> weakref to its client handle
        self._key_of: dict[int, int] = {}  # id -> storage key
        self._key_refs: dict[int, int] = {}  # storage key -> ids naming it
        self._storage_key: dict[int, tuple[Any, int]] = {}  # id(Storage) -> (it, key)
        self._key_sids: dict[int, list[int]] = {}  # storage key -> id(Storage)s naming it
        self._keys = itertools.count(1)

    def track(self, handle: Any, ref: int) -> None:
        kind = handle.device.type
        self.spec[ref] = TensorSpec(
            tuple(handle.shape), handle.dtype, "cuda" if kind in ("cuda", "meta") else kind
        )
        self._handles[ref] = weakref.ref(handle)

    def handle(self, ref: int) -> Any:
        """``ref``'s client handle, or ``None`` once the client let it go."""
        wr = self._handles.get(ref)
        return wr() if wr is not None else None

    def storage(self, ref: int) -> Any:
        """``ref``'s danaus Storage (which its views share), or ``None``."""
        return getattr(self.handle(ref), "_storage", None)

    def forget(self, ref: int) -> None:
        self.spec.pop(ref, None)
        self._handles.pop(ref, None)
        key = self._key_of.pop(ref, None)
        if key is not None:
            n = self._key_refs[key] = self._key_refs[key] - 1
            if n == 0:
                del self._key_refs[key]
                for sid in self._key_sids.pop(key, ()):
                    del self._storage_key[sid]

    def place(self, ref: int, alias_of: int | None = None) -> tuple[int, int]:
        """(storage key, bytes) of the new tensor ``ref``: its base's for a view or alias
        (a borrowed tensor's views: the borrowed tensor's, which is its origin's)."""
        storage = self.storage(ref)
        if alias_of is not None and alias_of in self._key_of:
            key = self._key_of[alias_of]
        elif storage is not None and id(storage) in self._storage_key:
            key = self._storage_key[id(storage)][1]
        else:
            key = next(self._keys)
        if storage is not None and id(storage) not in self._storage_key:
            self._storage_key[id(storage)] = (storage, key)
            self._key_sids.setdefault(key, []).append(id(storage))
        self._key_of[ref] = key
        self._key_refs[key] = self._key_refs.get(key, 0) + 1
        return key, self.nbytes(ref)

    def nbytes(self, ref: int) -> int:
        """The bytes of storage ``ref`` spans (a view: from its storage's start)."""
        h = self.handle(ref)
        spec = self.spec.get(ref)
        if h is None:
            return spec.nbytes if spec is not None else 0
        if h.numel() == 0:
            return 0
        span = (
            h.storage_offset()
            + sum((s - 1) * st for s, st in zip(h.shape, h.stride(), strict=True))
            + 1
        )
        return int(span * h.element_size())

    def total_bytes(self, refs: Any) -> int:
        """The bytes of the tensors ``refs`` (by their specs)."""
        return sum(self.spec[r].nbytes for r in refs if r in self.spec)

    def device(self, ref: int) -> str:
        spec = self.spec.get(ref)
        return spec.device if spec is not None else "cuda"

    def specs(self, tree: Any) -> Any:
        """``tree`` with each ref replaced by its spec, as the cost model reads it."""
        return pytree.tree_map(
            lambda x: (
                self.spec.get(x.id, TensorSpec((), torch.float32, "cuda"))
                if isinstance(x, Ref)
                else x
            ),
            tree,
            is_leaf=_is_ref,
        )

    def shares_storage(self, out: int, inp: int) -> bool:
        ho, hi = self.handle(out), self.handle(inp)
        return ho is not None and hi is not None and ho._storage is hi._storage

    def zeros(self, ref: int) -> torch.Tensor:
        """A CPU tensor of zeros shaped like ``ref``: its simulated value."""
        spec = self.spec.get(ref)
        with _disable_current_modes():
            if spec is None:
                return torch.zeros((), device="cpu")
            return torch.zeros(spec.shape, dtype=spec.dtype, device="cpu")


def ref_ids(tree: Any) -> list[int]:
    """The ids of the refs in ``tree`` (a command's arguments)."""
    return [x.id for x in pytree.tree_leaves(tree, is_leaf=_is_ref) if isinstance(x, Ref)]
