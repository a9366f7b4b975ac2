"""Transport layer: framed, ordered connections between procs.

Unix sockets on one host (in a directory only the user can open). Owns
addresses, listening, connecting and the per-connection byte stream.
Imports: ``_errors``, ``_wire``.
"""
