"""The settings of code sync."""

from __future__ import annotations

from ..setting import Setting, _MiB

CODE_SYNC: tuple[Setting, ...] = (
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
)
