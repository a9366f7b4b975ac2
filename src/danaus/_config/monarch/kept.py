"""Monarch's option names danaus accepts and keeps with no effect, each with why."""

from __future__ import annotations

from .option import _H, _HM, _MR, Encoding, MonarchOption, _m

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

KEPT_OPTIONS: tuple[MonarchOption, ...] = (
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
