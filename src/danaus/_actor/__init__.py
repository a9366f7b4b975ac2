"""Actor layer: Actor, @endpoint, actor/proc/host meshes, adverbs, futures, context.

Imports: ``_errors``, ``_mesh``, ``_wire``, ``_transport``, ``_runtime``.
Nothing here installs itself on import: ``danaus._bootstrap`` installs the
layer's frame handlers on each new node.
"""
