"""``SlurmJob``: hosts from a Slurm allocation, with one ``danaus worker`` per node.

``apply()`` submits a batch job with ``sbatch`` whose script runs ``srun``
with one worker per node; it waits (a progress line every few seconds) until
Slurm starts the job, then ``state()`` attaches to the workers on the nodes'
addresses. The job secret reaches the workers in a file only the user can
read, ``log_dir/.danaus-JOBNAME-RANDOM.secret`` (mode 0600, named to each
worker with ``--secret-file``; removed when the job ends): never on a command
line, in the script or in any process's environment. ``kill()`` runs
``scancel``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import subprocess
import sys
import time
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _config as config
from .._actor.api.hosts import HostMesh
from .._actor.api.joining import attach_to_workers
from .._transport.secret_env import environ_without_secret
from .jobs import JobTrait, _job_secret, client_argv, worker_port
from .statefile import Fields
from .workers import _check_mesh_name, _count

__all__ = ["SlurmError", "SlurmJob", "node_addresses"]

LOG_TAIL = 3000  # bytes of the job's log quoted when it fails (an error message's length)

_COMPLETING_POLLS = 20  # polls of a COMPLETING job for its final state

_ENDED = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "REVOKED",
    "TIMEOUT",
}


class SlurmError(RuntimeError):
    """Slurm refused the job, ended it, or did not start it in time (its reason quoted)."""


class SlurmJob(JobTrait):
    """Hosts from Slurm: ``SlurmJob({"trainers": 4})`` asks for 4 nodes, one worker each.

    The arguments follow Monarch's ``SlurmJob``: ``python_exe`` runs the worker
    on the nodes (it must import danaus); ``port`` is the port every worker
    listens on; ``slurm_args`` are extra ``#SBATCH`` options (``"--reservation=x"``);
    ``time_limit`` (``"HH:MM:SS"``), ``partition``, ``gpus_per_node``,
    ``cpus_per_task``, ``mem``, ``account``, ``qos``, ``exclusive`` map to the
    sbatch options of those names; ``ntasks_per_node`` is the allocation's
    ``--ntasks-per-node`` (what Slurm reserves per node: CPUs, and the
    tasks of your own ``srun`` steps), while danaus runs one worker per node
    either way (spawn several procs per host with ``spawn_procs``). The job is
    submitted ``--no-requeue``: a node that fails ends it (``NODE_FAIL``) and
    the client's ``SlurmError`` quotes Slurm's reason, where a requeued job
    would come back with new workers that hold none of the client's procs
    (``slurm_args=["--requeue"]`` asks for it anyway). The job's output goes to
    ``log_dir/slurm-JOBID-JOBNAME.out`` (``log_dir`` defaults to the current
    directory). ``job_start_timeout`` (seconds, ``None``: no limit) bounds the
    wait for the allocation; past it the job is cancelled and ``SlurmError``
    quotes Slurm's pending reason.

    ``apply(client_script="train.py --lr 0.1")`` (batch mode) submits one job
    that runs the workers and, on the allocation's first node, the client
    (a ``.py`` file first is run with ``python_exe``); ``apply`` returns once
    Slurm accepted it. The job is saved to the setting ``job_state_path``
    first, so the client's ``SlurmJob(same arguments).state()`` attaches to
    its own allocation. The allocation ends when the client exits, with the
    client's exit code; ``kill()`` in the client does not cancel it.

    Every value that goes into the batch script is checked: ``time_limit``,
    ``partition``, ``mem``, ``account`` and ``qos`` must be one word (no
    whitespace or control characters), ``log_dir``, ``python_exe`` and each of
    ``slurm_args`` must hold no control characters (a newline would start a
    line of shell in the script); ``ValueError`` names the field otherwise.
    """

    _KIND = "SlurmJob"

    def __init__(
        self,
        meshes: Mapping[str, int],
        python_exe: str = "python",
        slurm_args: Sequence[str] = (),
        port: int | None = None,
        job_name: str = "danaus_job",
        ntasks_per_node: int = 1,
        time_limit: str | None = None,
        partition: str | None = None,
        log_dir: str | None = None,
        exclusive: bool = True,
        gpus_per_node: int | None = None,
        cpus_per_task: int | None = None,
        mem: str | None = None,
        job_start_timeout: float | None = None,
        account: str | None = None,
        qos: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(meshes, Mapping) or not meshes:
            raise ValueError(
                f"meshes must be a non-empty dict of name -> node count, got {meshes!r}"
            )
        for name, n in meshes.items():
            _check_mesh_name(name)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"mesh {name!r} needs a node count >= 1, got {n!r}")
        port = worker_port(port)
        if isinstance(slurm_args, str):
            raise TypeError(f"slurm_args must be a list of options, got the string {slurm_args!r}")
        for arg in slurm_args:
            if not isinstance(arg, str) or not arg.startswith("-") or _has_control(arg):
                raise ValueError(
                    f"each of slurm_args must be one sbatch option ('--x=y') without control "
                    f"characters (newlines, tabs...), got {arg!r}"
                )
        time_limit, partition, mem, account, qos = (
            _sbatch_word(label, value)
            for label, value in (
                ("time_limit", time_limit),
                ("partition", partition),
                ("mem", mem),
                ("account", account),
                ("qos", qos),
            )
        )
        log_dir = os.path.abspath(log_dir if log_dir is not None else os.getcwd())
        for label, text in (("python_exe", python_exe), ("log_dir", log_dir)):
            if not isinstance(text, str) or not text or _has_control(text):
                raise ValueError(
                    f"{label} must be a non-empty path without control characters (newlines, "
                    f"tabs...): it goes into the batch script; got {text!r}"
                )
        for label, value in (
            ("ntasks_per_node", ntasks_per_node),
            ("gpus_per_node", gpus_per_node),
            ("cpus_per_task", cpus_per_task),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
        if job_start_timeout is not None and not job_start_timeout > 0:
            raise ValueError(
                f"job_start_timeout must be > 0 seconds or None, got {job_start_timeout!r}"
            )
        if (
            not isinstance(job_name, str)
            or not job_name
            or any(c.isspace() for c in job_name)
            or _has_control(job_name)
        ):
            raise ValueError(f"job_name must be a non-empty word, got {job_name!r}")
        self._sizes = dict(meshes)
        self._python_exe = python_exe
        self._slurm_args = list(slurm_args)
        self._port = port
        self._job_name = job_name
        self._ntasks_per_node = ntasks_per_node
        self._time_limit = time_limit
        self._partition = partition
        self._log_dir = log_dir
        self._exclusive = exclusive
        self._gpus_per_node = gpus_per_node
        self._cpus_per_task = cpus_per_task
        self._mem = mem
        self._job_start_timeout = job_start_timeout
        self._account = account
        self._qos = qos
        self._secret = _job_secret()
        # Where the workers read the secret: beside the log, which the nodes reach.
        self._secret_path = os.path.join(
            self._log_dir, f".danaus-{job_name}-{secrets.token_hex(6)}.secret"
        )
        self.job_id: str | None = None
        self._nodes: list[tuple[str, str]] = []  # (node name, address), in mesh order
        self._client: list[str] | None = None  # batch mode: the client's command

    def _spec(self) -> Any:
        return (
            self._sizes,
            self._python_exe,
            self._slurm_args,
            self._port,
            self._ntasks_per_node,
            self._time_limit,
            self._partition,
            self._exclusive,
            self._gpus_per_node,
            self._cpus_per_task,
            self._mem,
            self._account,
            self._qos,
        )

    # -- saving (JobTrait.dump) -------------------------------------------------------

    def _to_doc(self) -> dict[str, Any]:
        return {
            **super()._to_doc(),
            "sizes": self._sizes,
            "python_exe": self._python_exe,
            "slurm_args": self._slurm_args,
            "port": self._port,
            "job_name": self._job_name,
            "ntasks_per_node": self._ntasks_per_node,
            "time_limit": self._time_limit,
            "partition": self._partition,
            "log_dir": self._log_dir,
            "exclusive": self._exclusive,
            "gpus_per_node": self._gpus_per_node,
            "cpus_per_task": self._cpus_per_task,
            "mem": self._mem,
            "job_start_timeout": self._job_start_timeout,
            "account": self._account,
            "qos": self._qos,
            "secret": self._secret,
            "secret_path": self._secret_path,
            "job_id": self.job_id,
            "nodes": [[name, addr] for name, addr in self._nodes],
            "client": self._client,
        }

    def _from_doc(self, fields: Fields) -> None:
        super()._from_doc(fields)
        self._sizes = fields.mapping("sizes", _count, "node counts")
        self._python_exe = fields.text("python_exe")
        self._slurm_args = fields.text_list("slurm_args")
        self._port = fields.integer("port")
        self._job_name = fields.text("job_name")
        self._ntasks_per_node = fields.integer("ntasks_per_node")
        self._time_limit = fields.opt_text("time_limit")
        self._partition = fields.opt_text("partition")
        self._log_dir = fields.text("log_dir")
        self._exclusive = fields.boolean("exclusive")
        self._gpus_per_node = fields.opt_integer("gpus_per_node")
        self._cpus_per_task = fields.opt_integer("cpus_per_task")
        self._mem = fields.opt_text("mem")
        self._job_start_timeout = fields.opt_number("job_start_timeout")
        self._account = fields.opt_text("account")
        self._qos = fields.opt_text("qos")
        self._secret = fields.text("secret")
        self._secret_path = fields.text("secret_path")
        self.job_id = fields.opt_text("job_id")
        nodes = fields.get("nodes", _is_node_list, "a list of [node name, address] pairs")
        self._nodes = [(str(name), str(addr)) for name, addr in nodes]
        self._client = fields.opt_text_list("client")

    # -- the batch script ------------------------------------------------------------

    @property
    def log_path(self) -> str | None:
        """The job's output file (``None`` before ``apply()``)."""
        if self.job_id is None:
            return None
        return os.path.join(self._log_dir, f"slurm-{self.job_id}-{self._job_name}.out")

    def batch_script(self) -> str:
        """The script ``apply()`` submits (it holds no secret)."""
        nodes = sum(self._sizes.values())
        out = os.path.join(self._log_dir, f"slurm-%j-{self._job_name}.out")
        lines = [
            "#!/bin/bash",
            f"#SBATCH --job-name={self._job_name}",
            f"#SBATCH --nodes={nodes}",
            f"#SBATCH --ntasks-per-node={self._ntasks_per_node}",
            f"#SBATCH --output={out}",
        ]
        for flag, value in (
            ("time", self._time_limit),
            ("partition", self._partition),
            ("gpus-per-node", self._gpus_per_node),
            ("cpus-per-task", self._cpus_per_task),
            ("mem", self._mem),
            ("account", self._account),
            ("qos", self._qos),
        ):
            if value is not None:
                lines.append(f"#SBATCH --{flag}={value}")
        if self._exclusive:
            lines.append("#SBATCH --exclusive")
        lines.append("#SBATCH --no-requeue")  # slurm_args come later: "--requeue" there wins
        lines += [f"#SBATCH {arg}" for arg in self._slurm_args]
        # Every node listens on its NodeAddr, the address clients connect to (a worker
        # on 0.0.0.0 would advertise loopback). The secret is in a file only the user
        # can read (the worker checks that), removed when the script ends.
        secret_file = shlex.quote(self._secret_path)
        worker = shlex.join([self._python_exe, "-m", "danaus", "worker"])
        find_addr = (
            'addr=$(scontrol show node "$SLURMD_NODENAME" 2>/dev/null '
            '| grep -o "NodeAddr=[^ ]*" | cut -d= -f2)'
        )
        task = (
            f"{find_addr}; exec {worker} --secret-file {secret_file} "
            f'--listen "tcp://${{addr:-0.0.0.0}}:{self._port}"'
        )
        srun = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
        workers = f"{shlex.join(srun)} bash -c {shlex.quote(task)}"
        lines += ["", f"secret_file={secret_file}", """trap 'rm -f "$secret_file"' EXIT"""]
        if self._client is None:
            lines += [workers, ""]
        else:  # batch mode: the client on this (the first) node, the workers beside it
            lines += [
                f"{workers} &",
                "workers=$!",
                shlex.join(self._client),
                "code=$?",
                'kill "$workers" 2>/dev/null',
                'wait "$workers" 2>/dev/null',
                'exit "$code"',
                "",
            ]
        return "\n".join(lines)

    # -- applying --------------------------------------------------------------------

    def _submit(self) -> None:
        os.makedirs(self._log_dir, exist_ok=True)
        self._write_secret_file()
        out = _run(
            ["sbatch", "--parsable"], input=self.batch_script(), env=environ_without_secret()
        )
        if out.returncode != 0:
            self._remove_secret_file()
            raise SlurmError(f"sbatch refused the job: {out.stderr.strip() or out.stdout.strip()}")
        job_id = out.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch answered {out.stdout.strip()!r}, not a job id")
        self.job_id = job_id

    def _write_secret_file(self) -> None:
        """The job secret, for the workers: a new file only this user can read."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(self._secret_path, flags, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self._secret + "\n")

    def _remove_secret_file(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._secret_path)

    def _obtain_hosts(self) -> None:
        self._submit()
        try:
            self._nodes = self._wait_for_start()
        except BaseException:
            self._kill()
            raise

    def _apply_batch(self, client_script: str) -> None:
        self._client = client_argv(client_script, self._python_exe)
        self._applied = True
        # Saved before sbatch (the client may start at once; it finds its job id in
        # $SLURM_JOB_ID), and again with the id, for clients outside (`danaus kill`).
        path = self._save_for_batch_client()
        try:
            self._submit()
        except BaseException:
            self.kill()
            raise
        self.dump(path)

    def _job(self) -> str | None:
        """The Slurm job id: known once submitted; a batch client saved before the
        submission takes it from the allocation it runs in."""
        if self.job_id is None and self._client is not None:
            return os.environ.get("SLURM_JOB_ID")
        return self.job_id

    def _in_own_allocation(self) -> bool:
        job = self._job()
        return job is not None and os.environ.get("SLURM_JOB_ID") == job

    def _job_info(self) -> dict[str, str]:
        """``scontrol show job`` as a dict (empty once Slurm forgot the job)."""
        job = self._job()
        if job is None:
            return {}
        out = _run(["scontrol", "-o", "show", "job", job])
        if out.returncode != 0:
            if "Invalid job id" in out.stderr:
                return {}
            raise SlurmError(f"scontrol show job {job} failed: {out.stderr.strip()}")
        info: dict[str, str] = {}
        for word in out.stdout.split():
            key, sep, value = word.partition("=")
            if sep and key not in info:
                info[key] = value
        return info

    def _ended(self, info: dict[str, str]) -> SlurmError:
        # COMPLETING is on the way to the job's final state (NODE_FAIL, FAILED, ...):
        # wait a little for it, so that the error names how the job ended.
        for _ in range(_COMPLETING_POLLS):
            if info.get("JobState") != "COMPLETING":
                break
            time.sleep(config.get("slurm_poll_interval"))
            info = self._job_info() or info
        state = info.get("JobState", "gone")
        reason = info.get("Reason", "none given")
        if info and state not in _ENDED:  # e.g. PENDING again: requeued (slurm_args --requeue)
            what = f"stopped running ({state}, reason {reason}, restarts {info.get('Restarts')})"
        else:
            what = f"ended ({state}, reason {reason})"
        return SlurmError(
            f"Slurm job {self._job()} {what} before its workers were ready; its log "
            f"{self.log_path} ends with:\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        path = self.log_path
        try:
            assert path is not None
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - LOG_TAIL))
                return f.read().decode(errors="replace").strip() or "(empty)"
        except (OSError, AssertionError):
            return "(no log)"

    def _wait_for_start(self) -> list[tuple[str, str]]:
        start = time.monotonic()
        next_line = start + config.get("slurm_progress_every")
        while True:
            info = self._job_info()
            state = info.get("JobState", "")
            if state == "RUNNING":
                return self._node_addresses(info["NodeList"])
            if not info or state in _ENDED:
                raise self._ended(info)
            now = time.monotonic()
            reason = info.get("Reason", "None")
            if self._job_start_timeout is not None and now - start > self._job_start_timeout:
                raise SlurmError(
                    f"Slurm job {self.job_id} did not start within {self._job_start_timeout:g} s "
                    f"({state}, reason {reason}); cancelled it"
                )
            if now >= next_line:
                next_line = now + config.get("slurm_progress_every")
                print(
                    f"danaus: Slurm job {self.job_id} is {state} (reason {reason}), "
                    f"waited {now - start:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(config.get("slurm_poll_interval"))  # Slurm has no push channel

    def _node_addresses(self, nodelist: str) -> list[tuple[str, str]]:
        out = _run(["scontrol", "show", "hostnames", nodelist])
        if out.returncode != 0:
            raise SlurmError(f"scontrol show hostnames {nodelist} failed: {out.stderr.strip()}")
        names = out.stdout.split()
        addrs = node_addresses(nodelist)
        return [(name, addrs.get(name, name)) for name in names]

    # -- attaching, ending -----------------------------------------------------------

    def _meshes(self) -> dict[str, HostMesh]:
        if not self._nodes:  # batch mode: applied without waiting for the allocation
            self._nodes = self._wait_for_start()
        meshes: dict[str, HostMesh] = {}
        it = iter(self._nodes)
        for name, n in self._sizes.items():
            addrs = [
                f"tcp://{_bracket(addr)}:{self._port}" for _, addr in (next(it) for _ in range(n))
            ]
            meshes[name] = attach_to_workers(workers=addrs, secret=self._secret)
        # Workers that die at start (no danaus there, port taken) end the job, as does
        # a node that fails: say so with Slurm's reason and the log, rather than let
        # the attach retry until its deadline.
        for mesh in meshes.values():
            while True:
                try:
                    mesh.initialized.get(timeout=config.get("slurm_poll_interval") * 4)
                    break
                except TimeoutError:
                    info = self._job_info()
                    if info.get("JobState") != "RUNNING":
                        raise self._ended(info) from None
        return meshes

    @property
    def nodes(self) -> list[str]:
        """The allocated nodes' names, in mesh order (empty before ``apply()``)."""
        return [name for name, _ in self._nodes]

    def _still_running(self) -> bool:
        try:
            return self._job() is not None and self._job_info().get("JobState") == "RUNNING"
        except (SlurmError, OSError):
            return False

    def _kill(self) -> None:
        if self._in_own_allocation():
            return  # a batch client: the allocation ends when this client exits
        if self.job_id is not None:
            out = _run(["scancel", str(self.job_id)])
            if out.returncode != 0 and "Invalid job id" not in out.stderr:
                raise SlurmError(f"scancel {self.job_id} failed: {out.stderr.strip()}")
        self._remove_secret_file()  # the batch script's trap may not run when cancelled
        self._nodes = []


def node_addresses(nodelist: str) -> dict[str, str]:
    """Node name -> ``NodeAddr`` (the address Slurm reaches it at) for the nodes of
    ``nodelist`` (a Slurm host list, ``"n[01-04]"``), from one ``scontrol show node``.

    Names Slurm does not know, or all of them when ``scontrol`` fails, are left out.
    """
    try:
        out = _run(["scontrol", "-o", "show", "node", nodelist])
    except SlurmError:
        return {}
    addrs: dict[str, str] = {}
    for line in out.stdout.splitlines():
        fields = dict(w.partition("=")[::2] for w in line.split() if "=" in w)
        if fields.get("NodeName") and fields.get("NodeAddr"):
            addrs[fields["NodeName"]] = fields["NodeAddr"]
    return addrs


def _is_node_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(n, list) and len(n) == 2 and all(isinstance(x, str) for x in n) for n in value
    )


def _has_control(text: str) -> bool:
    """Whether ``text`` holds a control character (a newline ends an ``#SBATCH`` line)."""
    return any(unicodedata.category(c) == "Cc" or c in "\u2028\u2029" for c in text)


def _sbatch_word(label: str, value: Any) -> str | None:
    """``value`` of the sbatch option ``label`` as one word for its ``#SBATCH`` line."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # time_limit=60 (minutes), mem=16000 (MB): Slurm's own forms
    if (
        not isinstance(value, str)
        or not value
        or any(c.isspace() for c in value)
        or _has_control(value)
    ):
        raise ValueError(
            f"{label} must be one word for its #SBATCH line (no whitespace or control "
            f"characters: a newline would start a line of shell in the batch script), "
            f"got {value!r}"
        )
    return value


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    timeout = config.get("slurm_command_timeout")
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError:
        raise SlurmError(
            f"{argv[0]} is not installed here: SlurmJob needs Slurm's commands on PATH"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{shlex.join(argv)} took longer than {timeout:g} s") from None
