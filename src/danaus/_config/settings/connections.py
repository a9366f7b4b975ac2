"""The settings of connections and hosts."""

from __future__ import annotations

from ..setting import Setting

CONNECTIONS: tuple[Setting, ...] = (
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
        "zygote_preload",
        "str",
        "",
        "Modules (comma-separated, e.g. 'torch') that each host agent's zygote imports "
        "once, before it forks any proc, besides danaus's own: every proc, a replacement "
        "included, then starts with them loaded instead of importing them itself (torch: "
        "seconds, holding the GIL for long stretches). Read by the worker or agent when it "
        "starts; a module that fails to import is reported and skipped. Modules that start "
        "threads at import (numpy's OpenBLAS unless OPENBLAS_NUM_THREADS=1) are warned about.",
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
)
