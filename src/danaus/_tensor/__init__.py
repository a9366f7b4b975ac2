"""The tensor engine: torch tensors sharded across a proc mesh, driven from the client.

Owns distributed tensors (``Tensor``), the active mesh (``activate``,
``no_mesh``), the client's shape propagation and command stream, the
tensor-engine worker actor that holds each proc's shards, collectives over
named mesh dimensions (``reduce``) through ``torch.distributed`` process
groups, and fetching values back (``fetch_shard``, ``inspect``, ``show``).

Needs torch (the ``torch`` extra). Imports ``_actor``, ``_mesh``,
``_supervision`` and ``_errors``; nothing below imports this package except
``ProcMesh``'s ``activate``/``rank`` methods, which load it lazily on use so
that ``import danaus.actor`` never imports torch.

Modules: ``client`` (the client's tensor-engine state, one part of its
node), ``active`` (the active mesh and the dispatch mode), ``tensor``
(``Tensor`` and dispatch of torch ops), ``engine`` (the client side of one
mesh's workers), ``worker`` (the worker actor), ``messages`` (commands),
``collectives`` (``reduce``), ``fetch`` (``fetch_shard``, ``inspect``,
``show``), ``coalescing`` (holding a block's ops until it ends), ``errors``.
"""

from __future__ import annotations
