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

Modules, each importing only those before it (``tests/test_layers.py``
checks that no import, deferred ones included, closes a cycle): ``messages``
(commands), ``function`` (what ``remote`` sends: ``function_resolvers``),
``opaque_ref`` (``OpaqueRef``), ``simulator`` (``set_meta``), ``errors``,
``rendezvous`` (the store process groups meet through: an actor, no port),
``client`` (the client's tensor-engine state, one part of its node, and the
active mesh), ``worker_streams``, ``backends`` (the process group a worker's
collective runs on), ``stream`` (``Stream`` and borrows),
``worker`` (the worker actor), ``engine`` (the client side of one mesh's
workers), ``coalescing`` (holding a block's ops until it ends), ``actors``
(tensors as actor endpoint arguments), ``tensor`` (``Tensor`` and dispatch
of torch ops), ``fetch`` (``fetch_shard``, ``inspect``, ``show``),
``collectives`` (``reduce``), ``groups`` (``RemoteProcessGroup``),
``remote``, ``movement`` (``to_mesh``,
``slice_mesh``), ``active`` (activations and the dispatch mode), ``rref``
(``endpoint.rref``), ``autograd`` (``GradientGenerator``, ``grad_function``),
``timer`` (``danaus.timer``'s ``ExecutionTimer``), ``api``, which imports them
all, and ``builtins`` (``danaus.builtins``' remote functions). What a lower module
needs of a higher one comes as an object: ``Tensor``'s
``reduce``/``to_mesh``/``slice_mesh`` run what ``collectives`` and
``movement`` register with ``tensor.implement``, and a borrow's view is made
by the tensor it borrows (``Tensor._view_on``).
"""

from __future__ import annotations

# The names of ``api`` that the top-level ``danaus`` package shows, loading ``api`` on
# first access: here, without torch, so that ``import danaus`` can list them.
TOP_LEVEL = (
    "RemoteProcessGroup",
    "RemoteTensorError",
    "Stream",
    "Tensor",
    "call_on_shard_and_fetch",
    "coalescing",
    "fetch_shard",
    "get_active_mesh",
    "get_active_stream",
    "grad_function",
    "grad_generator",
    "inspect",
    "no_mesh",
    "reduce",
    "reduce_",
    "remote",
    "show",
    "slice_mesh",
    "to_mesh",
)
