"""Every setting of danaus, in one table: defaults < environment < ``configure()``.

A setting has a name, a type, a default, an environment variable
(``DANAUS_`` + the name in capitals) and one line of documentation. Its value
is the last of these that is set:

1. the default in :data:`SETTINGS`;
2. the environment variable, read when the setting is first needed;
3. ``configure(**kw)`` (or the ``configured(**kw)`` context manager) in this
   process.

Durations are seconds, given as a number or as a string with units
(``"500ms"``, ``"30s"``, ``"5m"``, ``"1h 30m"``); sizes are bytes, given as a
number or with a binary unit (``"64MiB"``, ``"4GiB"``). An unknown name is a
:class:`ValueError` that lists the valid ones; a value of the wrong type is a
:class:`TypeError`; a malformed environment variable is a :class:`ValueError`
naming the variable.

This module is below every layer (it imports nothing of danaus but
``_errors``), so any layer may read settings with :func:`get`. The process's
settings are one :class:`Config` object; the client hands the settings it has
configured to the host agent it starts (as environment variables), so procs
spawned on this host see them too. Workers on other hosts read their own
environment.

Secrets are not settings: ``DANAUS_SECRET`` is read only by the
authentication code, so that ``get_global_config()`` can be printed safely.
"""

from __future__ import annotations

import contextlib
import difflib
import enum
import functools
import inspect
import itertools
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MONARCH_OPTIONS",
    "SETTINGS",
    "Config",
    "Encoding",
    "MonarchOption",
    "NoEffectWarning",
    "Setting",
    "clear_runtime_config",
    "configure",
    "configured",
    "env_for_children",
    "get",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
]


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: its name, kind (``bool``, ``int``, ``float``, ``str``,
    ``duration``, ``size``), default and documentation."""

    name: str
    kind: str
    default: Any
    doc: str
    default_doc: str = ""  # how the default is computed, when it depends on the machine

    @property
    def env(self) -> str:
        return "DANAUS_" + self.name.upper()


_GiB = 1 << 30
_MiB = 1 << 20


def _default_max_frame() -> int:
    """4 GiB, or a quarter of this machine's memory if that is less (at least 64 MiB)."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 4 * _GiB
    return max(64 * _MiB, min(4 * _GiB, ram // 4))


#: The table of every setting. ``docs/config.md`` is generated from the same
#: rows (``python -m danaus._config`` prints it) and a test keeps the two equal.
SETTINGS: tuple[Setting, ...] = (
    # -- failure detection -------------------------------------------------
    Setting(
        "heartbeat_interval",
        "duration",
        0.5,
        "A quiet TCP connection sends a ping after this long.",
    ),
    Setting(
        "heartbeat_timeout",
        "duration",
        5.0,
        "A peer silent this long is judged: one on this host is lost if its kernel "
        "says it is stopped or gone, or it neither answers nor runs for half this "
        "again (a proc that runs is slow, not lost); one on another host is lost "
        "now if its frames came steadily, later (up to 2x) if they came irregularly "
        "(a phi-accrual detector).",
    ),
    Setting(
        "exit_report_grace",
        "duration",
        0.05,
        "After a spawned proc's connection closes, how long to wait for the host "
        "agent's report of how it exited before declaring it lost anyway.",
    ),
    Setting(
        "tcp_keepalive_idle",
        "duration",
        60.0,
        "Idle time after which the kernel sends its first TCP keepalive probe on the TCP "
        "message connections a process opens (whole seconds, at least 1): it lets a "
        "firewall or NAT keep an idle connection open, and the kernel see a peer host gone; "
        "a silent peer is judged sooner by heartbeat_timeout.",
    ),
    # -- messages ------------------------------------------------------------
    Setting(
        "codec_max_frame_length",
        "size",
        _default_max_frame(),
        "Largest frame a connection accepts; a frame announcing more is refused "
        "before anything is allocated and its connection closed.",
        "4 GiB, or a quarter of the machine's memory if less",
    ),
    Setting(
        "offload_min",
        "size",
        _MiB,
        "Message buffers at least this large travel between procs of one host as "
        "a one-sided process_vm copy instead of through the socket (0 disables).",
    ),
    Setting(
        "snapshot_pool",
        "size",
        512 * _MiB,
        "Bytes of shared snapshot slots (copies of large buffers sent to a proc of "
        "this host, which maps them), free or still mapped there, and separately of "
        "released private snapshot mappings, kept for reuse: faulting in fresh pages "
        "costs more than the copy itself.",
    ),
    Setting(
        "recv_pool",
        "size",
        512 * _MiB,
        "Bytes of receive memory (large frames and offloaded buffers, 1 MiB and up) "
        "kept mapped for reuse once nothing refers to it any more: faulting in fresh "
        "pages costs more than the copy into them (0 keeps none).",
    ),
    Setting(
        "recv_thread_min",
        "size",
        4 * _MiB,
        "A frame at least this large arriving on a socket (not TLS) is received by a "
        "thread of its own while the I/O loop goes on serving heartbeats and other "
        "connections (0: the I/O loop reads every frame).",
    ),
    Setting(
        "send_high_water",
        "size",
        64 * _MiB,
        "A thread sending to a proc for which this process already holds more than "
        "this many bytes (queued for a proc still starting, not yet written to its "
        "connection, or offloaded and not yet read) blocks until they fall to "
        "send_low_water, or the proc is lost. The I/O thread never blocks (0: never block).",
    ),
    Setting(
        "send_low_water",
        "size",
        16 * _MiB,
        "A sender held back by send_high_water goes on once the bytes held for its "
        "peer are down to this.",
    ),
    Setting(
        "send_snapshot_max",
        "size",
        64 * _MiB,
        "A message (call arguments or a result) whose out-of-band buffers (arrays, "
        "tensors) add up to more than this is not copied: the sending thread waits until "
        "its bytes have left this process's memory (read by the receiver on this host, "
        "or handed to the kernel's socket), so the receiver still gets what was passed. "
        "Smaller ones are copied (a snapshot) when they cannot leave at once, and the "
        "send returns at once. 64 MiB: a copy that size takes ~10 ms, and a sender "
        "holding that much for a peer waits anyway (send_high_water).",
    ),
    Setting(
        "staging_max",
        "size",
        256 * _MiB,
        "Bytes of snapshots of large messages (1 MiB and up) this process holds at once, "
        "for every peer together: a message whose snapshot would not fit is sent as one "
        "above send_snapshot_max is (its sender waits until its bytes have left). The "
        "I/O thread, which never waits, may go beyond it.",
    ),
    Setting(
        "inbox_high_water",
        "size",
        64 * _MiB,
        "When more than this many bytes wait in an actor's inbox or a port receiver, "
        "the connections bringing more are not read until they are down to "
        "inbox_low_water (TCP backpressure on their senders; 0: unbounded).",
    ),
    Setting(
        "inbox_low_water",
        "size",
        16 * _MiB,
        "Connections paused by inbox_high_water are read again once the inbox holds "
        "no more than this.",
    ),
    Setting(
        "coalesce_window",
        "duration",
        0.0,
        "Sends closer together than this are coalesced into one write by the I/O "
        "thread (0 writes at once).",
    ),
    Setting(
        "send_batch",
        "int",
        64,
        "Small frames one thread sends back to back, with no wait in between, are "
        "written together, up to this many in one system call (0 or 1: each at once).",
    ),
    Setting(
        "direct_read",
        "bool",
        True,
        "A thread that waits for a reply, or an idle actor waiting for its next call, "
        "reads the socket it will come on itself while the I/O thread is not reading "
        "it: two thread wake-ups fewer per round trip (not with TLS or uvloop).",
    ),
    Setting(
        "spin_wait",
        "duration",
        0.0002,
        "A direct read (direct_read) polls without sleeping for up to this long before "
        "it blocks: an answer that comes sooner is read without a thread wake-up. After a "
        "wait of more than 3 spins, the next waits on that connection skip it (1, 2, 4 ... "
        "up to 64). 0: never.",
    ),
    Setting(
        "send_batch_delay",
        "duration",
        0.001,
        "Sends closer together than this count as back to back for send_batch; held "
        "frames are written at the latest this long after the first (any wait in the "
        "process writes them at once).",
    ),
    Setting(
        "tree_min_ranks",
        "int",
        64,
        "Actor meshes of at least this many ranks are messaged through the cast tree "
        "(each proc forwards to its subtree); smaller ones get one frame per actor "
        "from the sender.",
    ),
    Setting(
        "tree_fanout",
        "int",
        16,
        "How many subtrees the sender and each proc of the cast tree forward to.",
    ),
    Setting(
        "tree_route_meshes",
        "int",
        4096,
        "How many actor meshes a proc keeps cast-tree routes for (least recently "
        "used are dropped; a cast through a dropped route fails that subtree).",
    ),
    Setting(
        "early_call_hold",
        "duration",
        1.0,
        "A call that reaches a proc before the SPAWN of its actor waits this long "
        "for it before it is answered as undeliverable.",
    ),
    Setting(
        "gc_freeze",
        "bool",
        True,
        "When the client's runtime starts, collect garbage once and then move every "
        "object alive at that moment (imported modules: torch's hundreds of thousands) "
        "into the garbage collector's permanent generation (gc.freeze), so its full "
        "collections stop traversing them; a spawned proc does the same (without the "
        "collection) once booted. Cycles among those objects are never collected "
        "afterwards. Skipped while the program has the collector disabled.",
    ),
    # -- connections and hosts ------------------------------------------------
    Setting(
        "handshake_timeout",
        "duration",
        5.0,
        "A TCP peer (message or data connection) must finish authenticating within this.",
    ),
    Setting(
        "max_pending_handshakes",
        "int",
        64,
        "TCP connections a listener keeps in their handshake at once (the dashboard: "
        "whose request head is unread); beyond it the oldest is closed "
        "(unauthenticated peers cannot hold more).",
    ),
    Setting(
        "flush_timeout",
        "duration",
        10.0,
        "How long closing a connection waits for its backlog to be written before "
        "closing anyway (a peer that stopped reading).",
    ),
    Setting(
        "insecure",
        "bool",
        False,
        "Allow attaching to workers started with --insecure (no secret, no "
        "authentication): for a trusted network only. The client then prints a "
        "warning to stderr.",
    ),
    Setting(
        "trust_sys_path",
        "bool",
        False,
        "On a worker, put every entry of the client's sys.path on the procs' sys.path, "
        "even ones that are missing here or writable by others; and let sync_workspace "
        "use workspace directories that another user owns or may write to.",
    ),
    Setting(
        "socket_dir",
        "str",
        "",
        "Directory for the per-user directory of Unix sockets (default: the "
        "system's temporary directory).",
    ),
    Setting(
        "advertise_addr",
        "str",
        "",
        "The IP address other hosts reach this client at (default: the source "
        "address of the route to the first worker).",
    ),
    Setting("tls_cert", "str", "", "PEM certificate for mutual TLS between hosts."),
    Setting("tls_key", "str", "", "PEM private key for mutual TLS between hosts."),
    Setting("tls_ca", "str", "", "PEM CA bundle that peers' certificates must chain to."),
    Setting(
        "attach_timeout",
        "duration",
        60.0,
        "How long attaching to a worker may take before it fails.",
    ),
    Setting(
        "attach_retry_deadline",
        "duration",
        60.0,
        "How long attach_to_workers keeps retrying a worker that refuses or cannot "
        "be reached (still starting, e.g. under a scheduler) before it fails naming it.",
    ),
    Setting(
        "attach_progress_every",
        "duration",
        5.0,
        "While attach_to_workers waits, a progress line naming the workers still "
        "missing is printed this often (0: at every retry).",
    ),
    Setting(
        "worker_start_timeout",
        "duration",
        60.0,
        "How long a job waits for a worker process it started to listen.",
    ),
    Setting(
        "job_probe_timeout",
        "duration",
        2.0,
        "When a client loads a job another client started (job_state_path), each of the "
        "job's workers must accept a TCP connection within this long, or the job counts "
        "as gone and is started afresh.",
    ),
    Setting(
        "worker_port",
        "int",
        26600,
        "The TCP port of the workers SSHJob and SlurmJob start (their port= argument "
        "overrides it), and the one hosts_from_config attaches to in a Slurm allocation.",
    ),
    Setting(
        "job_state_path",
        "str",
        ".danaus/job_state.json",
        "Where JobTrait.state() and the danaus apply/exec/kill commands keep the running "
        "job for the next client (relative to the current directory).",
    ),
    Setting(
        "job_stop_timeout",
        "duration",
        30.0,
        "How long job.kill() waits for the procs it spawned to stop before ending the workers.",
    ),
    Setting(
        "slurm_poll_interval",
        "duration",
        0.25,
        "How often SlurmJob asks Slurm (scontrol) whether the allocation runs; Slurm "
        "has no push channel.",
    ),
    Setting(
        "slurm_progress_every",
        "duration",
        5.0,
        "While SlurmJob waits for its allocation, a progress line quoting Slurm's "
        "state and reason is printed this often.",
    ),
    Setting(
        "slurm_command_timeout",
        "duration",
        60.0,
        "How long one Slurm command (sbatch, scontrol, scancel) may take before "
        "SlurmJob fails naming it.",
    ),
    Setting(
        "local_hosts",
        "int",
        2,
        "hosts_from_config outside a Slurm allocation: how many local worker hosts it starts.",
    ),
    Setting(
        "exec_timeout",
        "duration",
        3600.0,
        "How long `danaus exec` waits for its command to finish on every rank.",
    ),
    # -- code sync ------------------------------------------------------------
    Setting(
        "workspace_dir",
        "str",
        "",
        "A host's workspace root: HostMesh.sync_workspace places each synced directory "
        "under it and on the procs' sys.path. Read on each host.",
        default_doc="~/.cache/danaus/workspace ($XDG_CACHE_HOME/danaus/workspace)",
    ),
    Setting(
        "workspace_sync_batch_bytes",
        "size",
        64 * _MiB,
        "sync_workspace sends changed files in messages of about this many bytes.",
    ),
    Setting(
        "workspace_sync_timeout",
        "duration",
        300.0,
        "How long each step of sync_workspace (hashing on the hosts, writing a batch, "
        "reloading modules) may take.",
    ),
    # -- stopping ----------------------------------------------------------
    Setting(
        "stop_proc_timeout",
        "duration",
        10.0,
        "How long a stopping proc waits for its actors' cleanup before it exits anyway.",
    ),
    Setting(
        "shutdown_timeout",
        "duration",
        10.0,
        "How long shutdown_context() waits for the meshes it stops.",
    ),
    Setting(
        "stopped_actors_remembered",
        "int",
        10_000,
        "How many stopped actors each proc remembers, so that a late call to one is "
        "answered 'was stopped' (older ones are answered 'no such actor'); their "
        "memory is freed either way.",
    ),
    Setting(
        "main_exit_grace",
        "duration",
        5.0,
        "After an unhandled failure, how long the client's main thread gets to "
        "unwind (SystemExit) before danaus exits for it.",
    ),
    # -- logs ----------------------------------------------------------------
    Setting(
        "log_dir",
        "str",
        "",
        "Directory under which each job gets a directory of per-proc log files, on "
        "every host (default: logs/ in the per-user directory of the system's "
        "temporary directory).",
    ),
    Setting(
        "log_retention",
        "duration",
        7 * 86400.0,
        "Job log directories untouched for longer than this are deleted when a new "
        "job starts on the host (0 keeps them all).",
    ),
    Setting(
        "log_file_max",
        "size",
        _GiB,
        "A proc's log file that grows past this is renamed to NAME.log.1 (replacing "
        "an older one) and a new file is started.",
    ),
    Setting(
        "log_pipe_size",
        "size",
        _MiB,
        "Capacity asked of the pipes that carry each proc's stdout and stderr to its "
        "host agent (Linux caps it at /proc/sys/fs/pipe-max-size).",
    ),
    Setting(
        "log_max_line",
        "size",
        64 * 1024,
        "Longer output lines are split into pieces of this size.",
    ),
    Setting(
        "log_forward_window",
        "size",
        4 * _MiB,
        "Bytes of output lines a host agent sends to the client before the client "
        "has printed them.",
    ),
    Setting(
        "log_forward_buffer",
        "size",
        64 * _MiB,
        "Bytes of output lines a host agent holds for a client that does not keep up; "
        "beyond it lines are dropped and the client is told how many.",
    ),
    Setting(
        "log_frame_bytes",
        "size",
        256 * 1024,
        "Most bytes of output lines one forwarded log frame carries.",
    ),
    Setting(
        "log_tail_lines",
        "int",
        30,
        "Last output lines kept per proc: attached to the MeshFailure report of a "
        "crashed proc, and served by the client's log tail.",
    ),
    Setting(
        "log_tail_grace",
        "duration",
        1.0,
        "How long a crashed proc's MeshFailure waits for its last lines of output "
        "(when its connection broke before its host agent reported the exit), and "
        "the default failure report for the output forwarded so far.",
    ),
    Setting(
        "log_flush_timeout",
        "duration",
        10.0,
        "How long ProcMesh.stop() waits for the procs' last output to be printed.",
    ),
    Setting(
        "log_file_level",
        "str",
        "INFO",
        "Level of danaus's own diagnostics written to danaus.log in the job's log directory.",
    ),
    Setting(
        "log_stderr_level",
        "str",
        "ERROR",
        "Level from which the client also prints danaus's own diagnostics to its "
        "stderr (procs and host agents write them to the log file only).",
    ),
    Setting(
        "log_follow_interval",
        "duration",
        0.25,
        "How often `danaus logs --follow` looks for new lines.",
    ),
    # -- data plane ----------------------------------------------------------
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
    # -- observing -----------------------------------------------------------
    Setting(
        "metrics",
        "bool",
        True,
        "Count calls, errors and latencies per endpoint and bytes and frames per "
        "connection in every proc (read with mesh.stats() and the dashboard).",
    ),
    Setting(
        "dashboard",
        "bool",
        False,
        "Start the web dashboard with the client's runtime (as if the program "
        "called danaus.dashboard.serve()); its address is printed to stderr.",
    ),
    Setting(
        "dashboard_host",
        "str",
        "127.0.0.1",
        "The address the dashboard listens on (empty: 127.0.0.1, only this machine; "
        "every interface, 0.0.0.0 or ::, needs dashboard_all_interfaces). It is "
        "authenticated by the token in its URL either way.",
    ),
    Setting(
        "dashboard_all_interfaces",
        "bool",
        False,
        "Let the dashboard listen on every interface (dashboard_host 0.0.0.0 or ::), "
        "with a warning; without it such a host is refused.",
    ),
    Setting(
        "dashboard_port",
        "int",
        0,
        "The dashboard's TCP port (0: any free port).",
    ),
    Setting(
        "dashboard_interval",
        "duration",
        0.25,
        "How often the dashboard collects the procs' statistics and pushes them to "
        "the open pages and to `danaus top`.",
    ),
    Setting(
        "dashboard_request_timeout",
        "duration",
        10.0,
        "A connection to any of danaus's HTTP endpoints (the dashboard, serve_metrics) "
        "must send a whole tokened request within this, and one idle this long between "
        "requests (or not reading an answer) is closed.",
    ),
    Setting(
        "dashboard_max_connections",
        "int",
        32,
        "Tokened connections each of danaus's HTTP endpoints (the dashboard, "
        "serve_metrics) keeps open at once (an open page's live updates, a scraper); "
        "beyond it a request gets 503. Connections without the token yet: at most "
        "max_pending_handshakes, the oldest closed beyond it.",
    ),
    Setting(
        "metrics_min_interval",
        "duration",
        1.0,
        "Prometheus scrapes (serve_metrics, the dashboard's /metrics) within this of "
        "the last collection get that collection again instead of asking every proc.",
    ),
    Setting(
        "metrics_max_series",
        "int",
        1000,
        "Endpoint label sets (mesh, class, proc mesh, endpoint, rank) a Prometheus "
        "exposition holds at most (each is 221 series: calls, errors and a histogram "
        "of 219); beyond it further ones are dropped, counted in "
        "danaus_metrics_dropped_series, and one warning is logged (0: no bound).",
    ),
    Setting(
        "query_max_rows",
        "int",
        100_000,
        "Rows a telemetry SQL query (danaus.telemetry.query, danaus query, the "
        "dashboard) may answer; beyond it the query fails saying so.",
    ),
    Setting(
        "query_timeout",
        "duration",
        30.0,
        "How long a telemetry SQL query may run before it is interrupted and fails.",
    ),
    Setting(
        "query_max_memory",
        "size",
        _GiB,
        "Memory DuckDB may use for one telemetry SQL query.",
    ),
    Setting(
        "port_forward_max_connections",
        "int",
        256,
        "Connections each PortForwarder source proc relays at once; beyond it a new one is reset.",
    ),
    Setting(
        "port_forward_allow_remote",
        "bool",
        False,
        "Let a PortForwarder source accept connections from other hosts (anyone who "
        "can reach its address); without it only this host's processes of the same "
        "user may connect.",
    ),
    Setting(
        "port_forward_idle_timeout",
        "duration",
        3600.0,
        "A PortForwarder connection on which no byte moved either way for this long "
        "is reset (0: never).",
    ),
    Setting(
        "stats_timeout",
        "duration",
        2.0,
        "How long collecting statistics (mesh.stats(), the dashboard) waits for a "
        "proc before showing it as not answering.",
    ),
    Setting(
        "stack_timeout",
        "duration",
        20.0,
        "How long a stack dump (dashboard button, `danaus stack`) may take per proc.",
    ),
    Setting(
        "pyspy_bin",
        "str",
        "",
        "Path of the py-spy executable stack dumps run, tried first; if it is empty or not "
        "an executable, py-spy beside the Python executable, then on PATH.",
    ),
    Setting(
        "trace_max_events",
        "int",
        2_000_000,
        "Spans one proc keeps during a trace; later ones are counted as dropped "
        "(the trace file says how many).",
    ),
    Setting(
        "query_ring_size",
        "int",
        10_000,
        "Rows each proc keeps per table for danaus.telemetry.query (its recent messages, "
        "spans and ended actors); older rows are dropped, so memory stays bounded.",
    ),
    Setting(
        "query_messages_per_s",
        "int",
        1_000,
        "Messages a second each proc records in full for danaus.telemetry.query; above it "
        "only 1 in N is kept (each row's sample_rate says which); 0: record every message.",
    ),
    Setting(
        "telemetry",
        "bool",
        False,
        "OpenTelemetry across the mesh: calls made inside a span carry its context and "
        "their endpoints run in child spans; each process exports its spans and metrics "
        "as the OTEL_* variables say (needs danaus[telemetry]; JobTrait.enable_telemetry "
        "turns it on too).",
    ),
    Setting(
        "logtail_lines",
        "int",
        200,
        "Log lines kept per proc for the dashboard's log tail and failure reports.",
    ),
    Setting(
        "rdma_ptracer",
        "str",
        "",
        "'any' lets any process of this user read procs' memory (for hardened "
        "kernels whose Yama ptrace_scope blocks process_vm_readv between siblings).",
    ),
    # -- debugging -----------------------------------------------------------
    Setting(
        "debug_terminal",
        "bool",
        True,
        "When the client runs in an interactive terminal, offer the debugger prompt "
        "there as soon as an actor pauses in breakpoint() (`danaus debug` takes it over).",
    ),
    Setting(
        "debug_post_mortem",
        "bool",
        True,
        "An endpoint that raises after its breakpoint() opened a debug session stops "
        "in post-mortem pdb before its caller hears the error.",
    ),
    Setting(
        "debug_cast_wait",
        "duration",
        5.0,
        "How long the debugger's cast waits for the sessions to finish the command "
        "before it returns to the prompt (their output shows on attach).",
    ),
    Setting(
        "debug_output_max",
        "size",
        _MiB,
        "How much of a debug session's output (characters) is kept, in the paused "
        "proc until it is sent and in the client until it is shown: the last this "
        "much, after a line saying how much was dropped.",
    ),
)

_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}

_UNITS = {
    "ns": 1e-9,
    "nsec": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "usec": 1e-6,
    "ms": 1e-3,
    "msec": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
    "w": 7 * 86400.0,
    "week": 7 * 86400.0,
    "weeks": 7 * 86400.0,
}
_SIZES = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1000**4,
    "tib": 1 << 40,
}
_TERM = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([a-zµ]*)\s*", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """Seconds in ``"1.5"``, ``"500ms"``, ``"1h 30m"``; :class:`ValueError` otherwise."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    total, pos = 0.0, 0
    while pos < len(text):
        m = _TERM.match(text, pos)
        if m is None or m.end() == pos or m.group(2).lower() not in _UNITS:
            raise ValueError(
                f"{text!r} is not a duration; write seconds (1.5) or a number with one of "
                f"the units {', '.join(sorted(_UNITS))} ('500ms', '1h 30m')"
            )
        total += float(m.group(1)) * _UNITS[m.group(2).lower()]
        pos = m.end()
    if not text:
        raise ValueError("an empty string is not a duration")
    return total


def parse_size(text: str) -> int:
    """Bytes in ``"4096"``, ``"64MiB"``, ``"4 GiB"``; :class:`ValueError` otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", text, re.IGNORECASE)
    if m is None or m.group(2).lower() not in _SIZES:
        raise ValueError(
            f"{text!r} is not a size; write bytes (4096) or a number with a unit "
            "('64MiB', '4GiB', '10GB')"
        )
    return int(float(m.group(1)) * _SIZES[m.group(2).lower()])


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not a boolean; write 1/0, true/false, yes/no or on/off")


_FROM_TEXT: dict[str, Callable[[str], Any]] = {
    "bool": _parse_bool,
    "int": int,
    "float": float,
    "str": str,
    "duration": parse_duration,
    "size": parse_size,
}


def _coerce(setting: Setting, value: Any) -> Any:
    """A value given to ``configure()``, checked and converted to the setting's kind."""
    kind = setting.kind
    if kind == "bool":
        if isinstance(value, bool):
            return value
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind == "str":
        if isinstance(value, str):
            return value
    elif kind in ("float", "duration"):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0:
                raise ValueError(f"{setting.name} must not be negative (got {value!r})")
            return float(value)
        if kind == "duration" and isinstance(value, str):
            return parse_duration(value)
    elif kind == "size":
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise ValueError(f"{setting.name} must not be negative (got {value!r})")
            return value
        if isinstance(value, str):
            return parse_size(value)
    expected = {
        "duration": "seconds (int or float) or a string such as '30s'",
        "size": "bytes (int) or a string such as '64MiB'",
        "float": "a number",
    }.get(kind, kind)
    raise TypeError(f"{setting.name} takes {expected}, not {type(value).__name__} ({value!r})")


def _unknown(name: str) -> ValueError:
    near = difflib.get_close_matches(name, [*_BY_NAME, *_MONARCH], n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    return ValueError(
        f"{name!r} is not a danaus setting nor one of Monarch's option names (docs/config.md "
        f"lists both).{hint} The settings are: " + ", ".join(sorted(_BY_NAME))
    )


# -- Monarch's option names ---------------------------------------------------
#
# Every keyword argument Monarch's ``monarch.config.configure()`` accepts: the
# options its Rust attributes declare with a Python name
# (``@meta(CONFIG = ConfigAttr { py_name: Some(..) })``, read from
# meta-pytorch/monarch at 3fc0a66), plus the three ``remote_alloc_*`` options
# its typed signature still lists. An option danaus has the same knob for is an
# alias of that setting (both names read and write one value, converted where
# the units differ); any other is accepted, kept, returned by
# ``get_global_config()``, passed to spawned procs and reported once, when
# ``configure()`` first sets it, as having no effect.


class Encoding(enum.IntEnum):
    """Monarch's message payload encodings (``configure(default_encoding=...)``).

    danaus has one wire format of its own, so the choice is kept and reported,
    not used."""

    Bincode = 0
    Json = 1
    Multipart = 2

    def __str__(self) -> str:
        return f"Encoding.{self.name}"


class NoEffectWarning(UserWarning):
    """A Monarch option was configured that has no effect in danaus."""


@dataclass(frozen=True, slots=True)
class MonarchOption:
    """One of Monarch's option names: its type, its default as Monarch's
    ``get_global_config()`` shows it (``None``: no default, absent until set),
    its environment variable, and either the danaus setting it is an alias of
    or why it has no effect here."""

    name: str
    kind: str  # bool, int, nonzero, opt_nonzero, float, str, duration, opt_duration,
    # encoding, transport, port_range, socket_addr, level
    default: Any
    env: str
    setting: str = ""  # the danaus setting this name is an alias of
    why: str = ""  # no-effect options: why; aliases: how the value is converted
    unit: str = ""
    maximum: int | None = None


def _m(
    name: str,
    kind: str,
    default: Any,
    env: str,
    why: str,
    *,
    setting: str = "",
    unit: str = "",
    maximum: int | None = None,
) -> MonarchOption:
    return MonarchOption(name, kind, default, env, setting, why, unit, maximum)


_H, _HM, _MR = "HYPERACTOR_", "HYPERACTOR_MESH_", "MONARCH_RDMA_"
_ADMIN = "danaus has no mesh admin server; its dashboard (dashboard_* settings) shows the meshes."
_SPAWN_IDLE = (
    "danaus bounds spawning and stopping by the procs' liveness (heartbeat_timeout), "
    "not by an idle time."
)
_TRACING = (
    "Monarch's tracing sinks are not danaus's: its OpenTelemetry is the setting telemetry "
    "(JobTrait.enable_telemetry, OTEL_* variables); see also danaus.trace()."
)
_IBVERBS = (
    "danaus does not drive ibverbs itself: cross-host RDMA runs over TCP (rdma_streams), "
    "or over NIXL/UCX, which uses the RDMA NIC, with rdma_backend='nixl'."
)
_HYPERACTOR = "a knob of hyperactor's channel layer, which danaus does not have."

#: Monarch's option names, in the order of docs/config.md's second table.
MONARCH_OPTIONS: tuple[MonarchOption, ...] = (
    # -- aliases of danaus settings ---------------------------------------------
    _m(
        "codec_max_frame_length",
        "int",
        10 * _GiB,
        _H + "CODEC_MAX_FRAME_LENGTH",
        "the same setting (also takes a size string such as '1GiB').",
        setting="codec_max_frame_length",
        unit="bytes",
    ),
    _m(
        "stop_actor_timeout",
        "duration",
        "10s",
        _H + "STOP_ACTOR_TIMEOUT",
        "Monarch's duration string; danaus's value is seconds ('5s' is 5.0).",
        setting="stop_proc_timeout",
    ),
    _m(
        "tail_log_lines",
        "int",
        0,
        _HM + "TAIL_LOG_LINES",
        "the same count.",
        setting="log_tail_lines",
        unit="lines",
    ),
    _m(
        "max_cast_fanout",
        "nonzero",
        16,
        _HM + "MAX_CAST_FANOUT",
        "the same count.",
        setting="tree_fanout",
    ),
    _m(
        "rdma_tcp_fallback_parallelism",
        "int",
        1,
        _MR + "TCP_FALLBACK_PARALLELISM",
        "the same count.",
        setting="rdma_streams",
        unit="connections",
    ),
    _m(
        "terminated_snapshot_retention",
        "int",
        100,
        _H + "TERMINATED_SNAPSHOT_RETENTION",
        "the same count (danaus's default is 10000).",
        setting="stopped_actors_remembered",
        unit="actors",
    ),
    _m(
        "file_log_level",
        "level",
        "",
        "MONARCH_FILE_LOG",
        "Monarch's lower-case names ('debug', 'info', 'warn', 'error'; '' is 'info'); "
        "danaus's value is the logging name ('DEBUG', 'INFO', 'WARNING', 'ERROR').",
        setting="log_file_level",
    ),
    _m(
        "forwarder_flush_timeout",
        "duration",
        "5s",
        _H + "FORWARDER_FLUSH_TIMEOUT",
        "how long teardown waits for unsent messages to be written; Monarch's duration "
        "string, danaus's value is seconds.",
        setting="flush_timeout",
    ),
    _m(
        "mesh_admin_pyspy_timeout",
        "duration",
        "10s",
        _HM + "ADMIN_PYSPY_TIMEOUT",
        "how long one py-spy dump of a proc may run; Monarch's duration string, danaus's "
        "value is seconds (danaus's default is 20s).",
        setting="stack_timeout",
    ),
    _m(
        "pyspy_bin",
        "str",
        "",
        "PYSPY_BIN",
        "the same path, tried before the usual lookup (set it through configure() or "
        "DANAUS_PYSPY_BIN; Monarch's variable PYSPY_BIN is not read).",
        setting="pyspy_bin",
    ),
    _m(
        "channel_tcp_keepalive_idle",
        "duration",
        "1m",
        _H + "CHANNEL_TCP_KEEPALIVE_IDLE",
        "the kernel's keepalive idle time (TCP_KEEPIDLE) on TCP message connections; "
        "Monarch's duration string, danaus's value is seconds.",
        setting="tcp_keepalive_idle",
    ),
    # -- accepted, kept, with no effect -----------------------------------------
    _m(
        "default_transport",
        "transport",
        "unix",
        _HM + "DEFAULT_TRANSPORT",
        "danaus uses Unix sockets within a host and TCP between hosts; to choose, call "
        "enable_transport().",
    ),
    _m(
        "enable_log_forwarding",
        "bool",
        False,
        _HM + "ENABLE_LOG_FORWARDING",
        "danaus always forwards the procs' output to the client.",
    ),
    _m(
        "enable_file_capture",
        "bool",
        False,
        _HM + "ENABLE_FILE_CAPTURE",
        "danaus always writes each proc's output to its own log file (log_dir).",
    ),
    _m(
        "force_file_log",
        "bool",
        False,
        _H + "FORCE_FILE_LOG",
        "danaus always writes each proc's output to its own log file (log_dir).",
    ),
    _m(
        "prefix_with_rank",
        "bool",
        True,
        _H + "PREFIX_WITH_RANK",
        "danaus prints forwarded output with its own prefix.",
    ),
    _m(
        "read_log_buffer",
        "int",
        100,
        _H + "READ_LOG_BUFFER",
        "danaus's host agent does not pause its reader after a number of lines: it forwards "
        "output in frames of at most log_frame_bytes, with log_forward_window bytes in "
        "flight to the client.",
        unit="lines",
    ),
    _m(
        "message_delivery_timeout",
        "duration",
        "30s",
        _H + "MESSAGE_DELIVERY_TIMEOUT",
        "danaus does not acknowledge messages one by one, so it has no deadline by which an "
        "unacknowledged message is returned as undeliverable: a message to a lost proc is "
        "returned when supervision declares the proc lost (heartbeat_timeout); to bound one "
        "call, pass a timeout to its future's get().",
    ),
    _m("host_spawn_ready_timeout", "duration", "30s", _H + "HOST_SPAWN_READY_TIMEOUT", _SPAWN_IDLE),
    _m("mesh_proc_spawn_max_idle", "duration", "30s", _HM + "PROC_SPAWN_MAX_IDLE", _SPAWN_IDLE),
    _m("actor_spawn_max_idle", "duration", "30s", _HM + "ACTOR_SPAWN_MAX_IDLE", _SPAWN_IDLE),
    _m("proc_stop_max_idle", "duration", "30s", _HM + "PROC_STOP_MAX_IDLE", _SPAWN_IDLE),
    _m(
        "get_actor_state_max_idle", "duration", "30s", _HM + "GET_ACTOR_STATE_MAX_IDLE", _SPAWN_IDLE
    ),
    _m("get_proc_state_max_idle", "duration", "1m", _HM + "GET_PROC_STATE_MAX_IDLE", _SPAWN_IDLE),
    _m(
        "supervision_watchdog_timeout",
        "duration",
        "2m",
        _HM + "SUPERVISION_WATCHDOG_TIMEOUT",
        "danaus has no controller whose supervision stream could fall silent: procs are "
        "judged by heartbeats (heartbeat_interval, heartbeat_timeout); set those.",
    ),
    _m(
        "process_exit_timeout",
        "duration",
        "10s",
        _H + "PROCESS_EXIT_TIMEOUT",
        "danaus's host does not wait on a stopping proc with a deadline of its own: the proc "
        "exits by itself once its actors stopped or stop_proc_timeout passed; set "
        "stop_actor_timeout (stop_proc_timeout).",
    ),
    _m(
        "cleanup_timeout",
        "duration",
        "3s",
        _H + "CLEANUP_TIMEOUT",
        "danaus gives __cleanup__ no deadline of its own: a stopping proc waits up to "
        "stop_proc_timeout (stop_actor_timeout) for its actors, cleanup included, then exits; "
        "set that.",
    ),
    _m(
        "mesh_terminate_timeout",
        "duration",
        "10s",
        _HM + "TERMINATE_TIMEOUT",
        "danaus does not stop a proc with SIGTERM then SIGKILL: it asks it by a message and "
        "the proc exits by itself within stop_proc_timeout (stop_actor_timeout); a proc that "
        "is wedged is SIGKILLed by job.kill() after job_stop_timeout.",
    ),
    _m(
        "mesh_terminate_concurrency",
        "int",
        16,
        _HM + "TERMINATE_CONCURRENCY",
        "danaus stops a mesh's procs all at once.",
    ),
    _m(
        "mesh_bootstrap_enable_pdeathsig",
        "bool",
        True,
        _HM + "BOOTSTRAP_ENABLE_PDEATHSIG",
        "danaus's procs always die with their host agent.",
    ),
    _m(
        "mesh_orphan_timeout",
        "opt_duration",
        "1m",
        _HM + "ORPHAN_TIMEOUT",
        "danaus's procs stop when their client's connection is lost.",
    ),
    _m(
        "mesh_attach_config_timeout",
        "duration",
        "1m",
        _HM + "ATTACH_CONFIG_TIMEOUT",
        "danaus does not push settings to attached workers (they read their own "
        "environment); attaching is bounded by attach_timeout.",
    ),
    _m(
        "max_cast_dimension_size",
        "int",
        16,
        _HM + "MAX_CAST_DIMENSION_SIZE",
        "danaus's cast tree is shaped by tree_fanout, not by folding dimensions.",
    ),
    _m(
        "message_ack_time_interval",
        "duration",
        "500ms",
        _H + "MESSAGE_ACK_TIME_INTERVAL",
        _HYPERACTOR,
    ),
    _m(
        "message_ack_every_n_messages",
        "int",
        1000,
        _H + "MESSAGE_ACK_EVERY_N_MESSAGES",
        _HYPERACTOR,
    ),
    _m(
        "message_ttl_default",
        "int",
        64,
        _H + "MESSAGE_TTL_DEFAULT",
        _HYPERACTOR,
        unit="hops",
        maximum=255,
    ),
    _m(
        "split_max_buffer_size",
        "int",
        5,
        _H + "SPLIT_MAX_BUFFER_SIZE",
        "danaus does not buffer split-port updates.",
    ),
    _m(
        "split_max_buffer_age",
        "duration",
        "50ms",
        _H + "SPLIT_MAX_BUFFER_AGE",
        "danaus does not buffer split-port updates.",
    ),
    _m(
        "channel_net_rx_buffer_full_check_interval",
        "duration",
        "5s",
        _H + "CHANNEL_NET_RX_BUFFER_FULL_CHECK_INTERVAL",
        "danaus applies backpressure by inbox_high_water instead.",
    ),
    _m(
        "channel_reconnect_timeout",
        "duration",
        "1m",
        _H + "CHANNEL_RECONNECT_TIMEOUT",
        "danaus judges a silent or broken connection by heartbeat_timeout, not by a "
        "reconnect deadline.",
    ),
    _m(
        "channel_tcp_congestion",
        "str",
        "",
        _H + "CHANNEL_TCP_CONGESTION",
        "danaus keeps the host's TCP congestion control.",
    ),
    _m(
        "server_heartbeat_interval",
        "duration",
        "1s",
        _H + "SERVER_HEARTBEAT_INTERVAL",
        "a health metric hyperactor's channel servers emit; danaus emits none (its "
        "connections' liveness pings are heartbeat_interval; mesh.stats() shows the procs).",
    ),
    _m(
        "message_latency_sampling_rate",
        "float",
        0.01,
        _H + "MESSAGE_LATENCY_SAMPLING_RATE",
        "danaus measures every call's latency when metrics is on.",
        unit="fraction",
    ),
    _m(
        "enable_dest_actor_reordering_buffer",
        "bool",
        True,
        _H + "ENABLE_DEST_ACTOR_REORDERING_BUFFER",
        "danaus delivers a sender's messages to an actor in order by construction.",
    ),
    _m("sequencer_max_locked_keys", "nonzero", 128, _H + "SEQUENCER_MAX_LOCKED_KEYS", _HYPERACTOR),
    _m(
        "default_encoding",
        "encoding",
        Encoding.Multipart,
        _H + "DEFAULT_ENCODING",
        "danaus has one wire format of its own.",
    ),
    _m(
        "small_write_threshold",
        "int",
        256,
        "MONARCH_HYPERACTOR_SMALL_WRITE_THRESHOLD",
        "danaus copies or offloads message buffers by their size (offload_min).",
        unit="bytes",
    ),
    _m(
        "tokio_worker_threads",
        "opt_nonzero",
        None,
        "MONARCH_TOKIO_WORKER_THREADS",
        "danaus has no Tokio runtime.",
    ),
    _m(
        "enable_unawaited_python_task_traceback",
        "bool",
        False,
        "MONARCH_HYPERACTOR_ENABLE_UNAWAITED_PYTHON_TASK_TRACEBACK",
        "danaus has no Tokio-backed Python tasks.",
    ),
    _m(
        "remote_alloc_bind_to_inaddr_any",
        "bool",
        False,
        _H + "REMOTE_ALLOC_BIND_TO_INADDR_ANY",
        "danaus has no remote allocator (Monarch removed this option too).",
    ),
    _m(
        "remote_alloc_bootstrap_addr",
        "str",
        None,
        _H + "REMOTE_ALLOC_BOOTSTRAP_ADDR",
        "danaus has no remote allocator (Monarch removed this option too).",
    ),
    _m(
        "remote_alloc_allowed_port_range",
        "port_range",
        None,
        _H + "REMOTE_ALLOC_ALLOWED_PORT_RANGE",
        "danaus has no remote allocator (Monarch removed this option too); a worker's port "
        "is worker_port.",
    ),
    _m(
        "proc_launcher_kind",
        "str",
        "",
        _HM + "PROC_LAUNCHER_KIND",
        "danaus's host agent launches procs itself (no systemd launcher).",
    ),
    _m(
        "stop_grace_period",
        "duration",
        "10s",
        "HYPERACTOR_REMOTE_STOP_GRACE_PERIOD",
        "danaus has no remote spawner that force-kills a proc after a grace period: the "
        "proc exits by itself within stop_proc_timeout (stop_actor_timeout); set that.",
    ),
    _m(
        "process_memory_metric_interval",
        "duration",
        "5m",
        _HM + "PROCESS_MEMORY_METRIC_INTERVAL",
        "danaus has no periodic memory gauge; statistics are collected on demand "
        "(mesh.stats(), the dashboard).",
    ),
    _m("mesh_admin_addr", "socket_addr", "[::]:1729", _HM + "ADMIN_ADDR", _ADMIN),
    _m(
        "mesh_admin_config_dump_bridge_timeout",
        "duration",
        "5s",
        _HM + "ADMIN_CONFIG_DUMP_BRIDGE_TIMEOUT",
        _ADMIN,
    ),
    _m(
        "mesh_admin_max_concurrent_resolves",
        "int",
        2,
        _HM + "ADMIN_MAX_CONCURRENT_RESOLVES",
        _ADMIN,
    ),
    _m(
        "mesh_admin_pyspy_bridge_timeout",
        "duration",
        "13s",
        _HM + "ADMIN_PYSPY_BRIDGE_TIMEOUT",
        _ADMIN,
    ),
    _m(
        "mesh_admin_pyspy_client_timeout",
        "duration",
        "20s",
        _HM + "ADMIN_PYSPY_CLIENT_TIMEOUT",
        _ADMIN,
    ),
    _m(
        "mesh_admin_pyspy_max_profile_duration",
        "duration",
        "5m",
        _HM + "ADMIN_PYSPY_MAX_PROFILE_DURATION",
        _ADMIN,
    ),
    _m(
        "mesh_admin_query_child_timeout",
        "duration",
        "100ms",
        _HM + "ADMIN_QUERY_CHILD_TIMEOUT",
        _ADMIN,
    ),
    _m(
        "mesh_admin_resolve_actor_timeout",
        "duration",
        "200ms",
        _HM + "ADMIN_RESOLVE_ACTOR_TIMEOUT",
        _ADMIN,
    ),
    _m(
        "mesh_admin_single_host_timeout",
        "duration",
        "3s",
        _HM + "ADMIN_SINGLE_HOST_TIMEOUT",
        _ADMIN,
    ),
    _m("mesh_admin_tree_timeout", "duration", "10s", _HM + "ADMIN_TREE_TIMEOUT", _ADMIN),
    _m("enable_otel_metrics", "bool", True, "ENABLE_OTEL_METRICS", _TRACING),
    _m("enable_otel_tracing", "bool", True, "ENABLE_OTEL_TRACING", _TRACING),
    _m("enable_recorder_tracing", "bool", True, "ENABLE_RECORDER_TRACING", _TRACING),
    _m("enable_sqlite_tracing", "bool", False, "ENABLE_SQLITE_TRACING", _TRACING),
    _m("otel_metric_export_interval", "duration", "1s", "OTEL_METRIC_EXPORT_INTERVAL", _TRACING),
    _m("scuba_log_enter_exit", "bool", False, "SCUBA_LOG_ENTER_EXIT", _TRACING),
    _m(
        "monarch_log_suffix",
        "str",
        "",
        "MONARCH_LOG_SUFFIX",
        "danaus names its log files itself (log_dir).",
    ),
    _m(
        "rdma_allow_tcp_fallback",
        "bool",
        True,
        _MR + "ALLOW_TCP_FALLBACK",
        _IBVERBS + " False does not make transfers fail.",
    ),
    _m("rdma_disable_ibverbs", "bool", False, _MR + "DISABLE_IBVERBS", _IBVERBS),
    _m(
        "rdma_max_chunk_size_mb",
        "int",
        64,
        _MR + "MAX_CHUNK_SIZE_MB",
        "danaus splits a cross-host copy across rdma_streams connections, not into chunks.",
        unit="MiB",
    ),
    _m("rdma_ibverbs_target", "str", "", _MR + "IBVERBS_TARGET", _IBVERBS),
    _m("rdma_peer_device_affinity", "str", "", _MR + "PEER_DEVICE_AFFINITY", _IBVERBS),
    _m(
        "rdma_runtime_worker_threads",
        "int",
        16,
        _MR + "RUNTIME_WORKER_THREADS",
        "danaus serves RDMA data connections with threads (rdma_max_data_threads).",
    ),
    _m("rdma_qps_per_cq", "nonzero", 1, _MR + "QPS_PER_CQ", _IBVERBS),
    _m("rdma_qp_init_timeout", "duration", "30s", _MR + "QP_INIT_TIMEOUT", _IBVERBS),
    _m("rdma_cq_busy_poll_window", "opt_duration", None, _MR + "CQ_BUSY_POLL_WINDOW", _IBVERBS),
)

_MONARCH: dict[str, MonarchOption] = {o.name: o for o in MONARCH_OPTIONS}
#: The no-effect options (kept under their Monarch name); aliases map to a setting.
_KEPT: dict[str, MonarchOption] = {o.name: o for o in MONARCH_OPTIONS if not o.setting}
_reported: set[str] = set()
_bad_env_logged: set[str] = set()
_reported_lock = threading.Lock()


def format_duration(seconds: float) -> str:
    """``seconds`` as Monarch writes a duration (humantime): ``"1m 30s"``, ``"500ms"``."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    parts = []
    for unit, size in (
        ("d", 86400 * 10**9),
        ("h", 3600 * 10**9),
        ("m", 60 * 10**9),
        ("s", 10**9),
        ("ms", 10**6),
        ("us", 10**3),
        ("ns", 1),
    ):
        n, ns = divmod(ns, size)
        if n:
            parts.append(f"{n}{unit}")
    return " ".join(parts)


_LEVELS_IN = {"": "INFO", "trace": "DEBUG", "debug": "DEBUG", "info": "INFO",
              "warn": "WARNING", "warning": "WARNING", "error": "ERROR"}  # fmt: skip
_LEVELS_OUT = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "WARN": "warn",
               "ERROR": "error", "CRITICAL": "error"}  # fmt: skip


def _monarch_type_error(opt: MonarchOption, value: Any) -> TypeError:
    expected = {
        "bool": "a bool",
        "int": "an int (>= 0)",
        "nonzero": "an int (>= 1)",
        "opt_nonzero": "an int (>= 1) or None",
        "float": "a float",
        "str": "a str",
        "level": "a str ('debug', 'info', 'warn' or 'error')",
        "duration": "a duration string such as '30s' or '1m 30s' (or seconds)",
        "opt_duration": "a duration string such as '30s' (or seconds), or None",
        "encoding": "an Encoding (Encoding.Bincode, Encoding.Json or Encoding.Multipart)",
        "transport": "a ChannelTransport or an address string",
        "port_range": "a slice(start, stop) of ports",
        "socket_addr": "a socket address string such as '[::]:1729'",
    }[opt.kind]
    return TypeError(
        f"Monarch option {opt.name} takes {expected}, not {type(value).__name__} ({value!r})"
    )


def _check_port(opt: MonarchOption, v: Any, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 65535:
        raise TypeError(f"Monarch option {opt.name}: slice.{what} must be an int in [0, 65535]")
    return v


def _coerce_monarch(opt: MonarchOption, value: Any) -> Any:
    """A value given to ``configure()`` under a Monarch name, checked, in the form
    Monarch's ``get_global_config()`` returns it."""
    kind = opt.kind
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind in ("opt_duration", "opt_nonzero") and value is None:
        return None
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind in ("int", "nonzero", "opt_nonzero") and is_int:
        low = 0 if kind == "int" else 1
        if value < low or (opt.maximum is not None and value > opt.maximum):
            top = f" and <= {opt.maximum}" if opt.maximum is not None else ""
            raise ValueError(f"Monarch option {opt.name} must be >= {low}{top} (got {value!r})")
        return value
    if kind == "float" and (isinstance(value, float) or is_int):
        return float(value)
    if kind == "str" and isinstance(value, str):
        return value
    if kind == "level" and isinstance(value, str):
        if value.strip().lower() not in _LEVELS_IN:
            raise ValueError(
                f"Monarch option {opt.name} is 'debug', 'info', 'warn' or 'error', not {value!r}"
            )
        return value.strip().lower()
    if kind in ("duration", "opt_duration"):
        if isinstance(value, str):
            return format_duration(parse_duration(value))
        if (is_int or isinstance(value, float)) and value >= 0:
            return format_duration(float(value))
    if kind == "encoding":
        if isinstance(value, Encoding):
            return value
        if isinstance(value, str) and value.capitalize() in Encoding.__members__:
            return Encoding[value.capitalize()]
    if kind == "transport":
        if isinstance(value, enum.Enum) and type(value).__name__ == "ChannelTransport":
            return str(value.value)
        if isinstance(value, str) and value:
            return value
    if kind == "socket_addr" and isinstance(value, str):
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(
                f"Monarch option {opt.name} is a socket address such as '[::]:1729', not {value!r}"
            )
        return value
    if kind == "port_range" and isinstance(value, slice):
        if value.step not in (None, 1):
            raise ValueError(f"Monarch option {opt.name}: port ranges take no step (got {value})")
        start = _check_port(opt, value.start, "start")
        stop = _check_port(opt, value.stop, "stop")
        if start > stop:
            raise ValueError(
                f"Monarch option {opt.name}: slice({start}, {stop}) starts after it stops"
            )
        return slice(start, stop)
    raise _monarch_type_error(opt, value)


def _alias_in(opt: MonarchOption, value: Any) -> Any:
    """A Monarch value of alias ``opt``, as its danaus setting's value."""
    checked = _coerce_monarch(opt, value)
    if opt.kind == "duration":
        return parse_duration(checked)
    if opt.kind == "level":
        return _LEVELS_IN[checked]
    return checked


def _alias_out(opt: MonarchOption, value: Any) -> Any:
    """The value of ``opt``'s danaus setting, as Monarch shows it."""
    if opt.kind == "duration":
        return format_duration(value)
    if opt.kind == "level":
        return _LEVELS_OUT.get(str(value).upper(), str(value).lower())
    return value


def _monarch_to_text(opt: MonarchOption, value: Any) -> str:
    """A kept Monarch value as its environment variable text (see ``_monarch_from_text``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Encoding):
        return value.name.lower()
    if isinstance(value, slice):
        return f"{value.start}..{value.stop}"
    return str(value)


def _monarch_from_text(opt: MonarchOption, text: str) -> Any:
    kind = opt.kind
    if kind in ("opt_duration", "opt_nonzero") and text.strip().lower() in ("", "none"):
        return None
    if kind == "bool":
        return _parse_bool(text)
    if kind in ("int", "nonzero", "opt_nonzero"):
        return _coerce_monarch(opt, int(text))
    if kind == "float":
        return float(text)
    if kind == "port_range":
        start, sep, stop = text.partition("..")
        if not sep:
            raise ValueError(f"{text!r} is not a port range; write START..STOP")
        return _coerce_monarch(opt, slice(int(start), int(stop)))
    if kind == "encoding" and text.strip().lower() == "serde_json":
        return Encoding.Json
    return _coerce_monarch(opt, text)


def _report(names: list[str]) -> None:
    """Warn once per process for each no-effect Monarch option that was configured."""
    with _reported_lock:
        fresh = [n for n in names if n not in _reported]
        _reported.update(fresh)
    for name in fresh:
        warnings.warn(
            f"danaus.config: Monarch option {name!r} is kept but has no effect in danaus: "
            f"{_KEPT[name].why}",
            NoEffectWarning,
            stacklevel=4,
        )


class Config:
    """The settings of one process. Read with :meth:`get`; thread-safe."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ if environ is not None else os.environ
        self._lock = threading.Lock()  # guards _runtime and _cache
        self._runtime: dict[str, Any] = {}  # set by configure()
        self._cache: dict[str, Any] = {}  # effective values, filled on first read

    def get(self, name: str) -> Any:
        """The effective value of setting ``name`` (fast after the first read)."""
        try:
            return self._cache[name]
        except KeyError:
            pass
        setting = _BY_NAME.get(name)
        if setting is None:
            raise _unknown(name)
        with self._lock:
            value = self._resolve(setting)
            self._cache[name] = value
        return value

    def _resolve(self, setting: Setting) -> Any:
        if setting.name in self._runtime:
            return self._runtime[setting.name]
        raw = self._environ.get(setting.env)
        if raw is None:
            return setting.default
        try:
            return _FROM_TEXT[setting.kind](raw)
        except ValueError as e:
            raise ValueError(f"environment variable {setting.env}={raw!r}: {e}") from None

    def configure(self, **kwargs: Any) -> None:
        checked = {}
        kept = []
        for name, value in kwargs.items():
            setting = _BY_NAME.get(name)
            if setting is not None:
                checked[name] = _coerce(setting, value)
                continue
            opt = _MONARCH.get(name)
            if opt is None:
                raise _unknown(name)
            if opt.setting:  # an alias: store danaus's value under danaus's name
                checked[opt.setting] = _coerce(_BY_NAME[opt.setting], _alias_in(opt, value))
            else:
                checked[name] = _coerce_monarch(opt, value)
                kept.append(name)
        with self._lock:
            self._runtime.update(checked)
            self._cache.clear()
        _report(kept)

    def monarch(self, name: str) -> Any:
        """The value of Monarch option ``name`` as Monarch shows it (``None``: unset)."""
        opt = _MONARCH[name]
        if opt.setting:
            return _alias_out(opt, self.get(opt.setting))
        with self._lock:
            if name in self._runtime:
                return self._runtime[name]
        raw = self._environ.get(opt.env)
        if raw is None:
            return opt.default
        try:
            return _monarch_from_text(opt, raw)
        except (ValueError, TypeError) as e:
            # The option has no effect here: a stray variable must not stop a node.
            if opt.env not in _bad_env_logged:
                _bad_env_logged.add(opt.env)
                logging.getLogger("danaus.config").warning(
                    "ignoring environment variable %s=%r (Monarch option %s, no effect in "
                    "danaus): %s",
                    opt.env,
                    raw,
                    name,
                    e,
                )
            return opt.default

    def runtime(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._runtime)

    def restore(self, runtime: Mapping[str, Any]) -> None:
        with self._lock:
            self._runtime = dict(runtime)
            self._cache.clear()

    def effective(self) -> dict[str, Any]:
        """Every danaus setting, then every Monarch option name that has a value."""
        out = {s.name: self.get(s.name) for s in SETTINGS}
        for opt in MONARCH_OPTIONS:
            if opt.name not in out:
                value = self.monarch(opt.name)
                if value is not None or opt.kind in ("opt_duration", "opt_nonzero"):
                    out[opt.name] = value
        return out

    def env_for_children(self) -> dict[str, str]:
        """``DANAUS_*`` variables that give a child process this process's configured
        values (those set by ``configure()``; the environment is inherited anyway)."""
        out = {}
        for name, value in self.runtime().items():
            if name in _KEPT:
                out[_KEPT[name].env] = _monarch_to_text(_KEPT[name], value)
            else:
                out[_BY_NAME[name].env] = str(int(value) if isinstance(value, bool) else value)
        return out


_config = Config()


def get(name: str) -> Any:
    """The effective value of setting ``name`` in this process."""
    return _config.get(name)


def configure(**kwargs: Any) -> None:
    """Set settings for this process (and the procs it spawns on this host from now on).

    Does not block. Raises :class:`ValueError` for an unknown name (listing the
    valid ones) or a malformed duration or size, :class:`TypeError` for a value
    of the wrong type; nothing is changed when it raises::

        danaus.config.configure(heartbeat_timeout="2s", codec_max_frame_length="1GiB")
    """
    _config.configure(**kwargs)


@contextlib.contextmanager
def configured(**kwargs: Any) -> Iterator[dict[str, Any]]:
    """Apply ``configure(**kwargs)`` inside a ``with`` block, then restore the previous
    values; yields the effective settings. Raises as :func:`configure`."""
    saved = _config.runtime()
    _config.configure(**kwargs)
    try:
        yield _config.effective()
    finally:
        _config.restore(saved)


def get_global_config() -> dict[str, Any]:
    """Every setting's effective value (defaults < environment < configure), then each
    of Monarch's option names with its value as Monarch shows it (an alias converted
    from its danaus setting; see ``MONARCH_OPTIONS``)."""
    return _config.effective()


def get_runtime_config() -> dict[str, Any]:
    """Only the settings given to ``configure()`` in this process."""
    return _config.runtime()


def clear_runtime_config() -> None:
    """Forget every ``configure()`` value: environment and defaults apply again."""
    _config.restore({})


def env_for_children() -> dict[str, str]:
    """Environment variables carrying this process's ``configure()`` values to a child."""
    return _config.env_for_children()


def _parametrized(
    config_dicts: list[dict[str, Any]], param_ids: list[str]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    import pytest  # only the tests that use these decorators need pytest

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        orig_sig = inspect.signature(fn)
        first = inspect.Parameter("_config_overrides", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        new_sig = orig_sig.replace(parameters=[first, *orig_sig.parameters.values()])
        wrapped: Callable[..., Any]
        if inspect.iscoroutinefunction(fn):

            async def async_wrapper(
                _config_overrides: dict[str, Any], *args: Any, **kwargs: Any
            ) -> Any:
                with configured(**_config_overrides):
                    return await fn(*args, **kwargs)

            wrapped = async_wrapper
        else:

            def sync_wrapper(_config_overrides: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
                with configured(**_config_overrides):
                    return fn(*args, **kwargs)

            wrapped = sync_wrapper
        functools.update_wrapper(wrapped, fn)
        setattr(wrapped, "__signature__", new_sig)  # noqa: B010 - mypy: no such attribute
        marked: Callable[..., Any] = pytest.mark.parametrize(
            "_config_overrides", config_dicts, ids=param_ids
        )(wrapped)
        return marked

    return decorator


def parametrize_config(**config_options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A pytest decorator running the test once per combination (cartesian product) of
    the given values, each inside ``configured(...)`` with them, as Monarch's::

        @parametrize_config(prefix_with_rank={True, False}, tail_log_lines={0, 10})
        def test_x(): ...  # 4 runs

    Raises :class:`ValueError` without options."""
    if not config_options:
        raise ValueError("parametrize_config requires at least one config option")
    keys = list(config_options)
    combos = list(itertools.product(*(list(config_options[k]) for k in keys)))
    return _parametrized(
        [dict(zip(keys, c, strict=True)) for c in combos],
        ["-".join(f"{k}={v}" for k, v in zip(keys, c, strict=True)) for c in combos],
    )


def parametrize_config_pointwise(
    **config_options: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Like :func:`parametrize_config`, but the value sequences are taken in lockstep
    (``zip``): one run per position. Raises :class:`ValueError` without options or if
    the sequences' lengths differ."""
    if not config_options:
        raise ValueError("parametrize_config_pointwise requires at least one config option")
    keys = list(config_options)
    values = [list(config_options[k]) for k in keys]
    if len({len(v) for v in values}) != 1:
        lengths = {k: len(v) for k, v in zip(keys, values, strict=True)}
        raise ValueError(
            "parametrize_config_pointwise requires every option to have the same number "
            f"of values; got lengths {lengths}"
        )
    combos = list(zip(*values, strict=True))
    return _parametrized(
        [dict(zip(keys, c, strict=True)) for c in combos],
        ["-".join(f"{k}={v}" for k, v in zip(keys, c, strict=True)) for c in combos],
    )


def _monarch_type_doc(opt: MonarchOption) -> str:
    text = {
        "duration": "duration string ('30s')",
        "opt_duration": "duration string or None",
        "nonzero": "int >= 1",
        "opt_nonzero": "int >= 1 or None",
        "level": "str (log level)",
        "encoding": "Encoding",
        "transport": "ChannelTransport or str",
        "port_range": "slice(start, stop)",
        "socket_addr": "str (host:port)",
    }.get(opt.kind, opt.kind)
    return f"{text}, {opt.unit}" if opt.unit else text


def monarch_markdown_table() -> str:
    """Monarch's option names as the second Markdown table in ``docs/config.md``."""
    rows = [
        "| Monarch option | type | Monarch's default | in danaus |",
        "|---|---|---|---|",
    ]
    for o in MONARCH_OPTIONS:
        default = repr(o.default)
        if o.default is None and o.kind not in ("opt_duration", "opt_nonzero"):
            default = "(no default)"
        if isinstance(o.default, Encoding):
            default = f"Encoding.{o.default.name}"
        does = f"alias of `{o.setting}`: {o.why}" if o.setting else f"no effect: {o.why}"
        rows.append(f"| `{o.name}` | {_monarch_type_doc(o)} | {default} | {does} |")
    return "\n".join(rows)


def markdown_table() -> str:
    """The settings as the Markdown table in ``docs/config.md``."""
    rows = [
        "| setting | environment variable | kind | default | meaning |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        default = s.default_doc or (repr(s.default) if s.default != "" else "(unset)")
        rows.append(f"| `{s.name}` | `{s.env}` | {s.kind} | {default} | {s.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(markdown_table())
    print()
    print(monarch_markdown_table())
