"""Runtime layer: a proc's I/O loop, routing, mailboxes and ports, the host agent and zygote.

Imports: ``_errors``, ``_wire``, ``_transport``.
"""
