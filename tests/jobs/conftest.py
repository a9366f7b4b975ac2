"""Shared helpers for the job tests: free ports, local workers, client scripts."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

import danaus.testing
from danaus.testing import ClientScript, client_env
from multihost import conftest as _multihost
from multihost.conftest import Host, Network

network = _multihost.network  # the multi-host tests' bridge: Slurm nodes are namespaces on it


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry.name))
    return kids


@pytest.fixture(autouse=True)
def _no_job_workers_outlive_the_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that applies a job through the CLI and then fails (a timeout, an assert)
    before `exec --kill` / `context rm` would leave the job's detached workers running for
    the rest of the run. After each test, kill every worker recorded in a job state file
    under its tmp_path, with the worker's own children."""
    yield
    tmp = request.node.funcargs.get("tmp_path")
    if not isinstance(tmp, Path):
        return
    from danaus.job import job_load

    for state in tmp.rglob("job_state.json"):
        with contextlib.suppress(Exception):
            workers = job_load(str(state)).workers  # type: ignore[attr-defined]
            for pid in [w.pid for ws in workers.values() for w in ws]:
                for victim in [*_children(pid), pid]:
                    with contextlib.suppress(OSError):
                        os.kill(victim, signal.SIGKILL)


@pytest.fixture(scope="session")
def hosts_network(request: pytest.FixtureRequest) -> Network:
    """``network``, but a machine that cannot make namespaces fails the job tests (no silent
    skip: Slurm's nodes and the code-sync hosts are namespaces)."""
    try:
        net: Network = request.getfixturevalue("network")
    except pytest.skip.Exception as e:
        pytest.fail(f"the job tests need network namespaces (run as root): {e}")
    return net


TIMEOUT = 30.0
# Services die with pytest even if it is killed without its teardown (SIGKILL on parent death).
SETPRIV = shutil.which("setpriv")
DIE_WITH_PYTEST = [SETPRIV, "--pdeathsig", "KILL", "--"] if SETPRIV else []


def free_port() -> int:
    """A TCP port nothing listens on right now (on 127.0.0.1)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` different TCP ports nothing listens on right now (on 127.0.0.1): all are
    held while the others are picked, so none comes back twice."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class Scripts(ClientScript):
    """``ClientScript`` whose scripts also take command-line arguments."""

    env: dict[str, str] | None = None  # added to the client's environment

    def start_path(self, path: Path, *args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen(
            [sys.executable, str(path), *args],
            cwd=self.tmp_path,
            env={**client_env(), **(self.env or {})},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._running.append(p)
        return p


@pytest.fixture
def scripts(tmp_path: Path) -> Iterator[Scripts]:
    cs = Scripts(tmp_path)
    yield cs
    cs.close()


@pytest.fixture
def job_secret() -> str:
    return secrets.token_hex(32)


class LocalWorker:
    """``danaus worker`` on 127.0.0.1, started by a test, killed at teardown."""

    def __init__(self, port: int, secret: str, ip: str = "127.0.0.1") -> None:
        env = {**client_env(), "DANAUS_SECRET": secret}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "danaus", "worker", "--listen", f"tcp://{ip}:{port}"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline()  # bounded by the test's timeout

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(TIMEOUT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def local_workers() -> Iterator[list[LocalWorker]]:
    started: list[LocalWorker] = []
    yield started
    for w in started:
        w.kill()


# -- OpenSSH -------------------------------------------------------------------------

INSTALL_HINT = "run `sudo scripts/install-services` (installs openssh-server, slurm-wlm, munge)"


def need(binary: str, package: str) -> str:
    """The path of ``binary``; fails the test (never skips) when it is missing."""
    for d in ("", "/usr/sbin/", "/usr/bin/", "/sbin/"):
        path = shutil.which(binary) if not d else d + binary
        if path and os.access(path, os.X_OK):
            return path
    pytest.fail(f"{binary} (Debian package {package}) is not installed: {INSTALL_HINT}")


def read_until(stream: IO[str], wanted: list[str], what: str, limit: int = 200) -> list[str]:
    """Read lines from ``stream`` until each of ``wanted`` occurred in one; fail naming them."""
    seen: list[str] = []
    left = list(wanted)
    while left and len(seen) < limit:
        line = stream.readline()
        if not line:
            break
        seen.append(line.rstrip())
        left = [w for w in left if w not in line]
    if left:
        pytest.fail(f"{what} did not start: it never said {left!r}; it said:\n" + "\n".join(seen))
    return seen


@dataclass
class SSHD:
    """A private sshd on 127.0.0.1 and 127.0.0.2 (``port``) and the ssh options to reach it."""

    port: int
    ssh_args: list[str]
    directory: Path


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    """An sshd of the session's own: own config, host key and user key, in a temp dir.

    It listens on loopback addresses only, on a free non-default port, and takes
    only the test's key.
    """
    sshd_bin = need("sshd", "openssh-server")
    keygen = need("ssh-keygen", "openssh-client")
    need("ssh", "openssh-client")
    d = tmp_path_factory.mktemp("sshd")
    os.chmod(d, 0o700)
    for name in ("host_key", "user_key"):
        subprocess.run(
            [keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)],
            check=True,
            capture_output=True,
            timeout=TIMEOUT,
        )
    (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
    port = free_port()
    (d / "sshd_config").write_text(
        textwrap.dedent(
            f"""\
            Port {port}
            ListenAddress 127.0.0.1
            ListenAddress 127.0.0.2
            HostKey {d}/host_key
            PidFile {d}/sshd.pid
            AuthorizedKeysFile {d}/authorized_keys
            PermitRootLogin prohibit-password
            PubkeyAuthentication yes
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            UsePAM no
            StrictModes no
            PrintMotd no
            """
        )
    )
    host_pub = " ".join((d / "host_key.pub").read_text().split()[:2])
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port},[127.0.0.2]:{port} {host_pub}\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    proc = subprocess.Popen(
        [*DIE_WITH_PYTEST, sshd_bin, "-D", "-e", "-f", str(d / "sshd_config")],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stderr is not None
    drainer: threading.Thread | None = None
    try:
        read_until(
            proc.stderr,
            [
                f"Server listening on 127.0.0.1 port {port}",
                f"Server listening on 127.0.0.2 port {port}",
            ],
            "sshd",
        )
        drainer = drain(proc.stderr)
        ssh_args = [
            "-F", "/dev/null",
            "-p", str(port),
            "-i", str(d / "user_key"),
            "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={d}/known_hosts",
            "-o", "StrictHostKeyChecking=yes",
        ]  # fmt: skip
        yield SSHD(port, ssh_args, d)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the listener and its session children
        proc.wait(TIMEOUT)
        if drainer is not None:
            drainer.join(TIMEOUT)
        proc.stderr.close()


def drain(stream: IO[str]) -> threading.Thread:
    """Keep reading ``stream`` in the background so its writer never blocks."""
    t = threading.Thread(target=lambda: [None for _ in stream], daemon=True)
    t.start()
    return t


# -- Slurm -----------------------------------------------------------------------------


class Daemon:
    """A service process of the tests: its output is kept (for errors) and drained."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [*DIE_WITH_PYTEST, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self._ready = threading.Event()
        self._wanted: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)

    def wait_for(self, wanted: str, timeout: float = TIMEOUT) -> None:
        """Wait until the daemon prints a line containing ``wanted``; fail with its output."""
        self._wanted = [wanted]
        if not self._reader.is_alive():
            self._reader.start()
        if not self._ready.wait(timeout):
            pytest.fail(
                f"{self.name} did not start (exit code {self.proc.poll()}): it never said "
                f"{wanted!r} within {timeout} s; it said:\n" + "\n".join(self.lines[-40:])
            )

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if any(w in line for w in self._wanted):
                self._ready.set()

    def stop(self) -> None:
        """SIGKILL to its session: the cluster's state is thrown away with its temp dir."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(TIMEOUT)
        if self._reader.is_alive():
            self._reader.join(TIMEOUT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def wait_until(check: Any, what: str, timeout: float = TIMEOUT) -> None:
    """``danaus.testing.wait_until`` at Slurm's pace: no push channel, each poll runs a command."""
    danaus.testing.wait_until(check, timeout, what, interval=0.1)


@dataclass
class Slurm:
    """A private Slurm cluster: munged, slurmctld, and one slurmd per network-namespace node."""

    directory: Path
    conf: Path
    env: dict[str, str]
    nodes: dict[str, Host]  # node name -> its namespace host

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=TIMEOUT
        )

    def job_state(self, job_id: str) -> str:
        out = self.run("scontrol", "-o", "show", "job", job_id)
        for word in out.stdout.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "gone"

    def jobs(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i").stdout.split()


SLURM_CONF = """\
ClusterName=danaustest
SlurmctldHost={controller}({controller_ip})
SlurmUser={user}
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
MinJobAge=300
GresTypes=gpu
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


SLURM_NODES = 2
NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory, hosts_network: Network) -> Iterator[Slurm]:
    """munged + slurmctld + two slurmd of the session's own, configured in a temp dir.

    Each node (``danaus1``, ``danaus2``) is a network namespace on the
    multi-host tests' bridge, its slurmd running in it (``slurmd -N NAME``), so
    the jobs' workers listen on distinct addresses as on separate machines;
    slurmctld listens in the root namespace, reached at the bridge's address.

    Every daemon runs in the foreground under the fixture and is stopped at the
    end (jobs cancelled first); commands find the cluster through ``SLURM_CONF``,
    which this fixture sets for the session so client scripts inherit it.
    """
    munged = need("munged", "munge")
    slurmctld = need("slurmctld", "slurm-wlm")
    slurmd = need("slurmd", "slurm-wlm")
    need("sbatch", "slurm-wlm")
    need("nsenter", "util-linux")
    if os.geteuid() != 0:
        pytest.fail("the local Slurm cluster of the tests runs slurmd, which needs root")
    d = tmp_path_factory.mktemp("slurm")
    os.chmod(d, 0o755)
    for sub in ("munge", "state", "spool"):
        (d / sub).mkdir(mode=0o755)
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    hosts = {f"danaus{i + 1}": hosts_network.add_host() for i in range(SLURM_NODES)}
    conf = d / "slurm.conf"
    # Two GPUs per node, stand-in files for devices: enough for Slurm to grant
    # or refuse --gpus-per-node, which is what SlurmJob's tests check.
    for i in range(2):
        (d / f"gpu{i}").touch()
    (d / "gres.conf").write_text(f"Name=gpu File={d}/gpu[0-1]\n")
    conf.write_text(
        SLURM_CONF.format(
            d=d,
            controller=socket.gethostname().split(".")[0],
            controller_ip=hosts_network.gateway,
            nodes="\n".join(
                f"NodeName={name} NodeAddr={h.ip} CPUs=2 RealMemory=1000 Gres=gpu:2 State=UNKNOWN"
                for name, h in hosts.items()
            ),
            user="root",
            ctld_port=free_port(),
            slurmd_port=free_port(),
        )
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    mp = pytest.MonkeyPatch()
    mp.setenv("SLURM_CONF", str(conf))
    daemons: list[Daemon] = []
    cluster = Slurm(d, conf, env, hosts)
    try:
        m = Daemon(
            "munged",
            [
                munged, "--foreground", "--force", "--num-threads=10",
                f"--key-file={key}", f"--socket={d}/munge/munge.sock",
                f"--pid-file={d}/munge/munged.pid", f"--log-file={d}/munge/munged.log",
                f"--seed-file={d}/munge/seed",
            ],
        )  # fmt: skip
        daemons.append(m)
        m.wait_for("work threads")
        ctld = Daemon("slurmctld", [slurmctld, "-D", "-i", "-f", str(conf)], env)
        daemons.append(ctld)
        ctld.wait_for("Running as primary controller")
        for name, host in hosts.items():
            (d / "spool" / name).mkdir(mode=0o755)
            # nsenter, not `ip netns exec`: only the network namespace changes, so
            # slurmd still sees this machine's /sys (and its cgroup file system).
            argv = [NSENTER, f"--net=/run/netns/{host.netns}", slurmd, "-D", "-N", name]
            argv += ["-f", str(conf)]
            node = Daemon(f"slurmd {name}", argv, env)
            daemons.append(node)
            node.wait_for("slurmd started on")
        try:
            wait_until(
                lambda: cluster.run("sinfo", "-h", "-o", "%T").stdout.strip() == "idle",
                "the Slurm nodes becoming idle",
            )
        except pytest.fail.Exception:
            nodes = cluster.run("sinfo", "-N", "-h", "-o", "%N %T %E").stdout
            logs = "\n".join(line for dm in daemons for line in dm.lines[-15:])
            pytest.fail(f"the Slurm nodes did not become idle:\n{nodes}\n{logs}")
        yield cluster
    finally:
        try:
            jobs = cluster.jobs() if daemons else []
            if jobs:
                cluster.run("scancel", *jobs)
                wait_until(lambda: not cluster.jobs(), "the cancelled Slurm jobs ending")
        finally:
            for daemon in reversed(daemons):
                daemon.stop()
            mp.undo()
            for host in hosts.values():
                hosts_network.remove_host(host)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave this directory's ``slow`` tests out unless a ``-m`` expression is given."""
    if config.getoption("markexpr"):
        return
    here = Path(__file__).parent
    slow = [i for i in items if i.get_closest_marker("slow") and here in i.path.parents]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i not in slow]


# -- namespace hosts with private directories ------------------------------------------


def start_private_worker(host: Host, secret: str, private: str) -> _multihost.Worker:
    """``danaus worker`` in ``host``'s namespace with a private tmpfs at ``private``.

    The worker's mount namespace (``ip netns exec`` makes one) gets its own
    empty file system at ``private`` (its workspace root, ``DANAUS_WORKSPACE_DIR``),
    so each host's copy is invisible to the client and to the other hosts, as
    on separate machines. Returns once the worker listens.
    """
    socket_dir = f"/tmp/{host.netns}-{secrets.token_hex(3)}-sock"
    os.mkdir(socket_dir, 0o700)
    env = {**_multihost._worker_env(secret, socket_dir), "DANAUS_WORKSPACE_DIR": private}
    # The default heartbeat, not the multi-host tests' short one: these hosts run
    # torch, whose import can hold the GIL for seconds on a loaded machine.
    for name in ("DANAUS_HEARTBEAT_INTERVAL", "DANAUS_HEARTBEAT_TIMEOUT"):
        env.pop(name, None)
    sh = (
        'mount -t tmpfs -o mode=0700 danaus "$DANAUS_SOCKET_DIR" && '
        'mount -t tmpfs -o mode=0755 danaus-ws "$DANAUS_WORKSPACE_DIR" && '
        'exec "$0" -m danaus worker --listen "$1"'
    )
    argv = [_multihost.IP, "netns", "exec", host.netns, "sh", "-c", sh, sys.executable]
    proc = subprocess.Popen(
        [*DIE_WITH_PYTEST, *argv, f"tcp://{host.ip}:0"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    worker = _multihost.Worker(host, proc, "", socket_dir)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # bounded by the test's timeout
    if not line.startswith("danaus worker listening on "):
        _multihost._reap(worker)
        pytest.fail(f"the worker in {host.netns} did not start (said {line!r})")
    worker.address = line.split()[-1]
    return worker


@pytest.fixture(scope="session")
def private_hosts(
    hosts_network: Network, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Two namespace hosts whose workers each have a private tmpfs as workspace root.

    Shared by the session: each test's client syncs its own directory names
    and exits (a worker serves one client at a time, then the next).

    The root has the same path on both, and in the client's namespace it is an
    empty directory: whatever a host holds there, only that host sees.
    """
    secret = secrets.token_hex(32)
    root = str(tmp_path_factory.mktemp("ws-root"))
    hosts = [hosts_network.add_host() for _ in range(2)]
    workers = []
    try:
        for h in hosts:
            workers.append(start_private_worker(h, secret, root))
        yield {"secret": secret, "root": root, "workers": [w.address for w in workers]}
    finally:
        for w in workers:
            _multihost._reap(w)
        for h in hosts:
            hosts_network.remove_host(h)
