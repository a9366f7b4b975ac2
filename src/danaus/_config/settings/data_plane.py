"""The settings of data plane."""

from __future__ import annotations

from ..setting import Setting, _MiB

DATA_PLANE: tuple[Setting, ...] = (
    Setting(
        "rdma_streams",
        "int",
        4,
        "Parallel data connections one large cross-host RDMA copy is split across.",
    ),
    Setting(
        "rdma_cuda_chunk",
        "size",
        8 * _MiB,
        "Bytes per pinned host chunk when CUDA memory is staged (across hosts, or to a GPU "
        "this process cannot open by CUDA IPC): the device copy of one chunk overlaps the "
        "transfer of the next. Rounded up to a whole number of 256 KiB.",
    ),
    Setting(
        "rdma_max_data_threads",
        "int",
        64,
        "Data connections an RDMA owner serves at once (each is a thread); one beyond "
        "it is closed unserved, and its requester tries again (backing off) within its "
        "transfer's time.",
    ),
    Setting(
        "tensor_device",
        "str",
        "auto",
        "Where tensor-engine workers keep shards: 'cpu', 'cuda' (each proc's GPU, its rank "
        "modulo the GPUs it sees; NCCL collectives) or 'auto' (cuda when the client sees a GPU).",
    ),
    Setting(
        "tensor_collective_timeout",
        "duration",
        300.0,
        "Bound on one tensor-engine collective (gloo/NCCL process-group timeout); a dead peer "
        "is seen sooner, by supervision.",
    ),
    Setting(
        "tensor_send_delay",
        "duration",
        0.0005,
        "How long the tensor engine's sender waits for more commands after the last one queued, "
        "to send them in one message (anything that waits for a result sends at once); 0 sends "
        "each as soon as possible.",
    ),
    Setting(
        "tensor_send_max_delay",
        "duration",
        0.005,
        "While the client keeps issuing tensor ops (each tensor_send_delay brings more), the "
        "tensor engine's sender goes on gathering them into one message for at most this long.",
    ),
    Setting(
        "tensor_send_batch",
        "int",
        256,
        "Commands that, once queued, the tensor engine's sender sends without waiting longer.",
    ),
    Setting(
        "tensor_threads",
        "int",
        0,
        "torch intra-op threads in each tensor-engine worker's proc (torch.set_num_threads); "
        "0: the host's cores divided among the mesh's procs on it (at least 1), as torchrun "
        "does, so that procs sharing a host do not oversubscribe it.",
    ),
    Setting(
        "handoff_poll_interval",
        "duration",
        0.2,
        "While a tensor-engine stream waits for an actor to run a call it passed a tensor to, "
        "how often it checks that the actor still lives (a stopped or failed actor releases "
        "the stream).",
    ),
    Setting(
        "tensor_spawn_timeout",
        "duration",
        120.0,
        "Bound on spawning a mesh's tensor-engine workers at its first activate().",
    ),
    Setting(
        "rdma_lease_grace",
        "duration",
        5.0,
        "A same-host transfer pins the buffer it uses until it ends; if the reader "
        "neither finishes nor is lost, the pin expires this long after the "
        "transfer's own deadline (a drop() waits for the pins).",
    ),
    Setting(
        "rdma_connect_timeout",
        "duration",
        10.0,
        "Bound on connecting to another host's RDMA data server.",
    ),
    Setting(
        "rdma_backend",
        "str",
        "builtin",
        "Which backend moves a new RDMABuffer's bytes: 'builtin' (process_vm on one host, "
        "TCP data connections across hosts, CUDA IPC or staging for GPU memory; needs "
        "nothing installed), 'nixl' (NVIDIA NIXL over UCX, danaus[nixl]) or 'auto' (NIXL "
        "for CUDA memory where it is installed, builtin for CPU memory). A NIXL that cannot "
        "start falls back to builtin with one log line naming why.",
    ),
)
