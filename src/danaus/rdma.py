"""``danaus.rdma``: one-sided buffers for bulk data — Monarch's ``monarch.rdma``.

Bulk bytes never pass through mailboxes: register memory with
``RDMABuffer``, send the small handle in any message, and whoever holds it
copies bytes straight from or into the owner's memory, with no actor of the
owner taking part. On one host the kernel copies between the two processes
(``process_vm_readv``/``process_vm_writev``: one copy, no socket); across
hosts a separate authenticated data connection, served on the owner's own
threads, moves the bytes straight from and into the registered memory.

Example:

    from danaus.actor import Actor, endpoint, this_host
    from danaus.rdma import RDMABuffer

    class Weights(Actor):
        def __init__(self):
            self.data = bytearray(64 << 20)
            self.buf = RDMABuffer(self.data)

        @endpoint
        def handle(self) -> RDMABuffer:
            return self.buf

    weights = this_host().spawn_procs(per_host={"gpus": 1}).spawn("w", Weights)
    buf = weights.handle.call_one().get()
    local = bytearray(buf.size())
    buf.read_into(local).get()
"""

from __future__ import annotations

from ._public import publish
from ._rdma import buffer as _buffer
from ._rdma import errors as _errors
from ._rdma.buffer import RDMAAction as RDMAAction
from ._rdma.buffer import RDMABuffer as RDMABuffer
from ._rdma.buffer import get_rdma_backend as get_rdma_backend
from ._rdma.buffer import get_rdma_local_path as get_rdma_local_path
from ._rdma.buffer import gpu_direct_rdma_supported as gpu_direct_rdma_supported
from ._rdma.buffer import is_ibverbs_available as is_ibverbs_available
from ._rdma.buffer import is_rdma_available as is_rdma_available
from ._rdma.errors import RDMAError as RDMAError
from ._rdma.errors import RDMAOwnerLostError as RDMAOwnerLostError
from ._rdma.errors import RDMAReadTransferWarning as RDMAReadTransferWarning
from ._rdma.errors import RDMATamperedError as RDMATamperedError
from ._rdma.errors import RDMATcpFallbackWarning as RDMATcpFallbackWarning
from ._rdma.errors import RDMAWriteTransferWarning as RDMAWriteTransferWarning

# The buffer module's public names and the data plane's errors and warnings.
__all__ = _buffer.__all__ + _errors.__all__

publish(globals(), __all__)
