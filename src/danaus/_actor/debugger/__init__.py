"""The distributed debugger: ``breakpoint()`` in an endpoint, driven from ``danaus debug``.

``remote`` is the proc side (the pdb whose terminal is the client; its
``install`` is the bootstrap's), ``controller`` the actor in the client that
holds the paused sessions and serves the ``danaus debug`` prompt
(``debug_controller``), ``session`` what the two share, ``commands`` the
prompt's syntax. Nothing here is imported until it is used: the client loads
the controller on its first ``debug_controller()``, and only spawned procs load
``remote`` (pdb), preloaded by the zygote.
"""
