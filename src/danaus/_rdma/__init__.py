"""RDMA layer (the data plane): one-sided buffers whose bytes never pass through mailboxes.

Owns ``RDMABuffer`` (a registered region of local memory and the small
picklable handle that names it), ``RDMAAction`` (a batch of transfers), the
node's registry of registered memory, the ``RDMA_CHECK`` /
``RDMA_DROP`` / ``RDMA_DATA`` frame handlers that every runtime answers on
its I/O thread, the copy engine (``process_vm_readv`` / ``process_vm_writev``
between the processes of one host) and the data connections across hosts
(``net.py``: authenticated TCP, served by threads of their own): together the
built-in plane. Behind one seam (``backend.py``; started and chosen per the
setting ``rdma_backend`` in ``plane.py``) another backend may move a buffer's
bytes instead: NVIDIA NIXL over UCX (``nixl.py``, ``danaus[nixl]``).

Imports: ``_errors``, ``_wire``, ``_transport``, ``_runtime``, ``_actor``.
Nothing installs itself on import: ``danaus._bootstrap`` installs the frame
handlers on each new node.
"""
