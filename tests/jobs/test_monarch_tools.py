"""Monarch's job helpers and command line on danaus: ``danaus shell``, ``danaus context``,
``exec --env/--workdir/--script/--kill``, ``exec_command``, ``shell``, ``PortForwarder``,
``set_current_job``/``load_current_job`` and ``danaus.tools.commands`` (issue 28 §3)."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import danaus.config as danaus_config
from danaus.actor import this_host, this_proc
from danaus.job import (
    DEFAULT_JOB_PATH,
    PortForwarder,
    ProcessJob,
    job_load,
)
from danaus.testing import client_env, wait_pids_gone, wait_until
from danaus.tools import commands
from danaus.tools.config import Config
from danaus.tools.mesh_spec import AppState, MeshSpec, mesh_spec_from_metadata, tag_as_metadata
from danaus.tools.network import AddrType, get_ipaddr, get_sockaddr

from .conftest import free_ports

JOBFILE = """\
from danaus.job import ProcessJob

job = ProcessJob({"hosts": 2})
"""


def danaus(cwd: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "danaus", *args],
        cwd=cwd,
        env=client_env(),
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_exec_env_workdir_script_and_monarch_rank_variables(tmp_path: Path) -> None:
    (tmp_path / "myjob.py").write_text(JOBFILE)
    assert danaus(tmp_path, "apply", "myjob.job").returncode == 0
    saved = job_load(str(tmp_path / DEFAULT_JOB_PATH))
    pids = [w.pid for w in saved.workers["hosts"]]  # type: ignore[attr-defined]
    echo = 'echo "$FOO $MONARCH_RANK_hosts/$MONARCH_SIZE_hosts $DANAUS_RANK_HOSTS $(pwd)"'
    out = danaus(
        tmp_path, "exec", "--all", "-e", "FOO=a=b", "--workdir", "/", "--", "sh", "-c", echo
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[hosts=0] a=b 0/2 0 /", "[hosts=1] a=b 1/2 1 /"]
    script = danaus(tmp_path, "exec", "--point", "hosts=1", "--script", "-", stdin="exit 4\n")
    assert script.returncode == 4
    bad = danaus(tmp_path, "exec", "-e", "NOEQUALS", "--", "true")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
    killed = danaus(tmp_path, "exec", "--kill", "--", "true")
    assert killed.returncode == 0, killed.stderr
    assert wait_pids_gone(pids) == []
    assert not (tmp_path / DEFAULT_JOB_PATH).exists()


def test_exec_all_runs_on_every_mesh_and_mesh_alone_on_every_rank_of_it(tmp_path: Path) -> None:
    (tmp_path / "twojob.py").write_text(
        "from danaus.job import ProcessJob\n\njob = ProcessJob({'trainers': 2, 'evals': 1})\n"
    )
    assert danaus(tmp_path, "apply", "twojob.job").returncode == 0
    saved = job_load(str(tmp_path / DEFAULT_JOB_PATH))
    pids = [w.pid for ws in saved.workers.values() for w in ws]  # type: ignore[attr-defined]
    echo = 'echo "rank $MONARCH_RANK_hosts"'
    out = danaus(tmp_path, "exec", "--all", "--", "sh", "-c", echo)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "[trainers hosts=0] rank 0",
        "[trainers hosts=1] rank 1",
        "[evals hosts=0] rank 0",
    ]
    one_mesh = danaus(tmp_path, "exec", "--mesh", "trainers", "--", "sh", "-c", echo)
    assert one_mesh.stdout.splitlines() == ["[hosts=0] rank 0", "[hosts=1] rank 1"]
    rank0 = danaus(tmp_path, "exec", "--mesh", "trainers", "--one", "--", "sh", "-c", echo)
    assert rank0.stdout.splitlines() == ["[hosts=0] rank 0"]
    worst = danaus(
        tmp_path, "exec", "--all", "--kill", "--", "sh", "-c", 'exit "$MONARCH_RANK_hosts"'
    )
    assert worst.returncode == 1, worst.stderr  # the largest exit code over both meshes
    assert wait_pids_gone(pids) == []


def test_the_end_of_input_stops_a_foreground_command_of_a_shell_on_pipes(tmp_path: Path) -> None:
    # Monarch's test_shell_eof_stops_foreground_process: a command that never reads
    # stdin (sleep 30) must not keep the shell, and the client, past the input's end
    pid_file = tmp_path / "child-pid"
    script = tmp_path / "client.py"
    script.write_text(
        "import sys\n"
        "from danaus.actor import this_host\n"
        "from danaus.job import shell\n"
        "print('rc', shell(this_host(), env={'SHELL': '/bin/bash'}), file=sys.stderr)\n"
    )
    command = f"sh -c 'echo $$ > {pid_file}; exec sleep 30'\n"
    client = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, env=client_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert client.stdin is not None
        client.stdin.write(command)
        client.stdin.flush()
        wait_until(pid_file.exists, timeout=30, what="the foreground command to start")
        child = int(pid_file.read_text())
        client.stdin.close()  # end of input while `sleep 30` runs in the foreground
        client.stdin = None  # so that communicate() does not flush it
        _, err = client.communicate(timeout=25)  # 2 s of grace, then a hang-up
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert client.returncode == 0, err
    rc = int(err.split("rc ")[-1].split()[0])
    assert rc != 0  # hung up: 128 + SIGHUP
    assert wait_pids_gone([child]) == []


def test_a_script_read_from_a_file_runs_to_its_end_past_the_hang_up_grace(
    tmp_path: Path,
) -> None:
    # a file's end is the script's end, not a hang-up: `shell < script.sh` finishes
    (tmp_path / "script.sh").write_text("sleep 3; echo finished; exit 5\n")
    (tmp_path / "client.py").write_text(
        "from danaus.actor import this_host\n"
        "from danaus.job import shell\n"
        "raise SystemExit(shell(this_host()))\n"
    )
    with open(tmp_path / "script.sh") as script:
        done = subprocess.run(
            [sys.executable, "client.py"], cwd=tmp_path, env=client_env(), stdin=script,
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 5, done.stderr
    assert done.stdout == "finished\n"


def test_shell_reads_commands_from_stdin_without_a_terminal(tmp_path: Path) -> None:
    (tmp_path / "myjob.py").write_text(JOBFILE)
    assert danaus(tmp_path, "apply", "myjob.py:job").returncode == 0
    saved = job_load(str(tmp_path / DEFAULT_JOB_PATH))
    pids = [w.pid for w in saved.workers["hosts"]]  # type: ignore[attr-defined]
    commands_in = 'echo "hi $X $MONARCH_SIZE_hosts"; pwd; echo oops >&2; exit 3\n'
    out = danaus(tmp_path, "shell", "-e", "X=y", "--workdir", "/", stdin=commands_in)
    assert out.returncode == 3, out.stderr
    assert out.stdout.splitlines() == ["hi y ", "/"]  # a one-host slice has no dimension left
    assert "oops" in out.stderr
    assert danaus(tmp_path, "shell", "--point", "hosts=1", stdin="exit 0\n").returncode == 0
    wrong = danaus(tmp_path, "shell", "--point", "gpus=0", stdin="")
    assert wrong.returncode == 2 and "--point names ['gpus']" in wrong.stderr
    ended = danaus(tmp_path, "shell", "--kill", stdin="true\n")
    assert ended.returncode == 0, ended.stderr
    assert wait_pids_gone(pids) == []


def test_contexts_keep_jobs_apart(tmp_path: Path) -> None:
    (tmp_path / "myjob.py").write_text(JOBFILE)
    assert danaus(tmp_path, "context", "create", "eval").returncode == 0
    assert danaus(tmp_path, "context", "use", "eval").returncode == 0
    applied = danaus(tmp_path, "apply", "myjob.py:job")
    assert applied.returncode == 0, applied.stderr
    eval_state = tmp_path / ".danaus" / "contexts" / "eval" / "job_state.json"
    assert eval_state.exists() and not (tmp_path / DEFAULT_JOB_PATH).exists()
    eval_pids = [w.pid for w in job_load(str(eval_state)).workers["hosts"]]  # type: ignore[attr-defined]
    assert danaus(tmp_path, "context", "ls").stdout.splitlines() == ["  default", "* eval"]
    assert (tmp_path / ".danaus").stat().st_mode & 0o777 == 0o700

    assert danaus(tmp_path, "context", "use", "default").returncode == 0
    nothing = danaus(tmp_path, "apply")  # the default context has no job spec yet
    assert nothing.returncode == 2 and "run `danaus apply JOB` first" in nothing.stderr
    assert danaus(tmp_path, "context", "use", "eval").returncode == 0
    again = danaus(tmp_path, "apply")  # the context's recorded spec; its job still runs
    assert again.returncode == 0, again.stderr
    assert [w.pid for w in job_load(str(eval_state)).workers["hosts"]] == eval_pids  # type: ignore[attr-defined]

    removed = danaus(tmp_path, "context", "rm", "eval")
    assert removed.returncode == 0, removed.stderr
    assert wait_pids_gone(eval_pids) == []
    assert danaus(tmp_path, "context", "ls").stdout.splitlines() == ["* default"]
    bad = danaus(tmp_path, "context", "use", "../x")
    assert bad.returncode == 2 and "context name" in bad.stderr


# Run in a client process of its own: attaching this test process to loopback workers
# would fix the address it advertises for the rest of the run (tests/multihost's
# namespace hosts could not reach it).
CURRENT_JOB_CLIENT = """
import json, sys
from pathlib import Path
from danaus.job import (
    DEFAULT_JOB_PATH, ProcessJob, exec_command, load_current_job, set_current_job, shell,
)

out = {}
try:
    load_current_job()
except FileNotFoundError as e:
    out["no_job"] = "danaus apply JOB" in str(e)
try:
    set_current_job("nodots")
except ValueError as e:
    out["bad_spec"] = "module.attr" in str(e)
set_current_job("pyjob.job")
job = load_current_job()
out["loaded"] = isinstance(job, ProcessJob) and not job.active
hosts = job.state().hosts
try:
    out["saved"] = Path(DEFAULT_JOB_PATH).exists()
    print("EXEC-BEGIN", flush=True)
    out["rc"] = exec_command(
        hosts, ["sh", "-c", "echo $MONARCH_RANK_gpus$V; exit $MONARCH_RANK_gpus"],
        env={"V": "!"}, point={"hosts": 1}, per_host={"gpus": 2},
    ).get(timeout=60)
    print("EXEC-END", flush=True)
    try:
        shell(hosts)
    except ValueError as e:
        out["one_host"] = "one host" in str(e)
    Path("in.sh").write_text("echo from-shell; exit 7\\n")
    with open("in.sh") as stdin, open("out.txt", "w") as stdout:
        sys.stdin, sys.stdout, saved = stdin, stdout, sys.stdout  # files: no terminal
        try:
            out["shell_rc"] = shell(hosts.slice(hosts=0))
        finally:
            sys.stdin, sys.stdout = sys.__stdin__, saved
    out["shell_out"] = Path("out.txt").read_text()
finally:
    job.kill()
print("RESULT " + json.dumps(out), flush=True)
"""


def test_current_job_exec_command_and_shell_from_python(tmp_path: Path) -> None:
    (tmp_path / "pyjob.py").write_text(JOBFILE)
    (tmp_path / "client.py").write_text(CURRENT_JOB_CLIENT)
    r = subprocess.run(
        [sys.executable, "client.py"],
        cwd=tmp_path,
        env=client_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    result = json.loads(next(x for x in lines if x.startswith("RESULT "))[len("RESULT ") :])
    assert result == {
        "no_job": True,
        "bad_spec": True,
        "loaded": True,
        "saved": True,
        "rc": 1,
        "one_host": True,
        "shell_rc": 7,
        "shell_out": "from-shell\n",
    }, r.stdout + r.stderr
    # What the two ranks printed, forwarded to the client, between the markers.
    printed = lines[lines.index("EXEC-BEGIN") + 1 : lines.index("EXEC-END")]
    assert sorted(x for x in printed if x.endswith("!")) == ["0!", "1!"], r.stdout


def test_port_forwarder_relays_connections_until_stopped() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    dst_port = server.getsockname()[1]

    def echo() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1024):
                conn.sendall(data.upper())

    threading.Thread(target=echo, daemon=True).start()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        src_port = probe.getsockname()[1]
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    other = this_host().spawn_procs(per_host={"gpus": 1})
    forwarder = this_proc().spawn("fwd", PortForwarder)
    try:
        with pytest.raises(Exception, match="same shape"):
            forwarder.forward.call_one(
                procs, dst_port, this_host().spawn_procs(per_host={"gpus": 2}), "127.0.0.1:1"
            ).get(timeout=60)
        forwarder.forward.call_one(procs, dst_port, other, f"127.0.0.1:{src_port}").get(timeout=60)
        with socket.create_connection(("127.0.0.1", src_port), timeout=30) as conn:
            conn.sendall(b"hello")
            conn.shutdown(socket.SHUT_WR)
            got = b""
            while data := conn.recv(1024):
                got += data
        assert got == b"HELLO"
        forwarder.stop().get(timeout=60)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", src_port), timeout=30).close()
    finally:
        server.close()
        procs.stop().get(timeout=60)
        other.stop().get(timeout=60)


def test_port_forwarder_holds_a_fast_client_back_cuts_resets_and_stops_at_once() -> None:
    """Monarch's port-forward behaviours: flow control (a service that reads slowly gets
    every byte, in order), a client's reset cuts the service's side, procs share one
    source address, and stopping does not wait for a connection whose service never
    reads. Stops are bounded by 60 s in the procs, so a stop that waited for the stuck
    connection would exceed the 30 s this test allows it."""
    payload = bytes(range(256)) * (16 * 4096)  # 16 MiB
    slow = socket.create_server(("127.0.0.1", 0))
    streaming = socket.create_server(("127.0.0.1", 0))
    never = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []
    cut = threading.Event()
    held: list[socket.socket] = []

    def read_slowly() -> None:
        with contextlib.suppress(OSError):  # closed at the end if never reached
            _read_slowly()

    def _read_slowly() -> None:
        conn, _ = slow.accept()
        with conn:
            chunks = []
            while data := conn.recv(4096):
                chunks.append(data)
            got.append(b"".join(chunks))
            conn.sendall(b"done")

    def stream_until_cut() -> None:
        try:
            conn, _ = streaming.accept()
        except OSError:
            return
        with conn:
            try:
                while True:
                    conn.sendall(b"x" * 65536)
            except OSError:
                cut.set()

    def accept_and_never_read() -> None:
        with contextlib.suppress(OSError):
            held.append(never.accept()[0])

    for fn in (read_slowly, stream_until_cut, accept_and_never_read):
        threading.Thread(target=fn, daemon=True).start()
    with danaus_config.configured(stop_proc_timeout="60s"):
        procs = this_host().spawn_procs(per_host={"procs": 2})
        forwarder = this_proc().spawn("fwd_flow", PortForwarder)
        try:
            ports = free_ports(3)  # distinct: sources share a port only on purpose
            for service, port in zip((slow, streaming, never), ports, strict=True):
                forwarder.forward.call_one(
                    procs, service.getsockname()[1], procs, f"127.0.0.1:{port}"
                ).get(timeout=60)  # both procs listen on the one address

            with socket.create_connection(("127.0.0.1", ports[0]), timeout=60) as conn:
                conn.sendall(payload)
                conn.shutdown(socket.SHUT_WR)
                assert conn.recv(16) == b"done"
            assert got == [payload]

            client = socket.create_connection(("127.0.0.1", ports[1]), timeout=60)
            assert client.recv(65536)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # a reset, not a clean close
            assert cut.wait(30), "the service never saw the client's reset"

            stuck = socket.create_connection(("127.0.0.1", ports[2]), timeout=60)
            stuck.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                while True:  # fill every buffer on the way: the service reads nothing
                    stuck.send(b"y" * 65536)
            forwarder.stop().get(timeout=30)
            stuck.close()
        finally:
            for sock in (slow, streaming, never, *held):
                sock.close()
            procs.stop().get(timeout=90)


def test_tools_commands_treat_a_saved_job_as_a_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = ProcessJob({"trainers": 2})
    assert '"kind": "ProcessJob"' in commands.create(Config(job=job, dryrun=True), "t")
    with pytest.raises(ValueError, match="TorchX"):
        commands.create(Config(job=job, scheduler_args={"partition": "x"}), "t")
    assert commands.info("danaus:///t") is None
    handle = commands.create(Config(job=job), "t")
    assert handle == "danaus:///t"
    spec = commands.info(handle)
    assert spec is not None and spec.is_running and spec.state == AppState.RUNNING
    assert spec.get_mesh_names() == ["trainers"]
    assert spec.host0("trainers") == "127.0.0.1"
    assert spec.to_json()["meshes"]["trainers"]["hosts"] == 2
    pids = [w.pid for w in job.workers["trainers"]]
    commands.kill_and_confirm(handle)
    assert wait_pids_gone(pids) == []
    assert commands.info(handle) is None
    with pytest.raises(ValueError, match="danaus:///NAME"):
        commands.info("slurm:///123")


def test_a_mesh_spec_travels_in_an_appdefs_metadata_under_monarchs_keys() -> None:
    # Monarch's tools/test_mesh_spec.py with an object shaped like TorchX's AppDef
    from types import SimpleNamespace

    appdef = SimpleNamespace(metadata={}, roles=[])
    tag_as_metadata(MeshSpec(name="trainer", num_hosts=2, host_type="gpu.medium", gpus=2), appdef)
    assert appdef.metadata == {
        "monarch/meshes/trainer/host_type": "gpu.medium",
        "monarch/meshes/trainer/gpus": "2",
        "monarch/meshes/trainer/transport": "tcp",
    }
    appdef.metadata["monarch/meshes/trainer/transport"] = "metatls"
    appdef.roles = [SimpleNamespace(name="trainer", image="img", num_replicas=4, port_map={})]
    spec = mesh_spec_from_metadata(appdef, "trainer")
    assert spec is not None
    assert (spec.num_hosts, spec.host_type, spec.gpus, spec.transport, spec.image) == (
        4,
        "gpu.medium",
        2,
        "metatls",
        "img",
    )
    assert spec.port == 26600  # no "mesh" port in the role's port map: the default
    assert mesh_spec_from_metadata(appdef, "generator") is None


def test_network_lookups_follow_monarchs_address_families() -> None:
    assert get_ipaddr("127.0.0.1", 80, AddrType.IPv4) == "127.0.0.1"
    assert get_sockaddr("127.0.0.1", 8080) == "127.0.0.1:8080"
    with pytest.raises(RuntimeError, match="Unable to resolve"):
        get_ipaddr("127.0.0.1", 80, AddrType.IPv6)


def test_the_tools_cli_parses_as_monarchs_and_runs_through_its_module_functions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from danaus.tools import cli

    parser = cli.get_parser()
    assert parser.parse_args(["apply", "jobs.mast"]).module_path == "jobs.mast"
    args = parser.parse_args(["exec", "--per-host", "gpu=4", "nvidia-smi"])
    assert (args.run_all, args.per_host, args.cmd) == (False, "gpu=4", ["nvidia-smi"])
    for argv in (["--all", "--mesh", "w"], ["--mesh", "w", "--all"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["exec", *argv, "echo"])
    calls: list[dict[str, object]] = []
    monkeypatch.setattr(cli, "shell_on_job", lambda **kw: calls.append(kw) or 3)
    args = parser.parse_args(["shell", "--mesh", "w", "--point", "host=2", "-e", "A=b"])
    with pytest.raises(SystemExit) as exited:
        args.func(args)
    assert exited.value.code == 3  # the shell's exit code, as Monarch's
    assert calls == [
        {"mesh_name": "w", "point_str": "host=2", "env": ["A=b"], "workdir": None, "kill": False}
    ]


def test_the_tools_cli_has_monarchs_dashboard_mast_which_refuses_to_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Monarch's tools/test_cli.py parses `dashboard mast`; its open-source build refuses it
    from danaus.tools import cli

    args = cli.get_parser().parse_args(["dashboard", "mast", "job1", "--role-name", "w"])
    assert (args.job, args.role_name, args.dashboard_port) == ("job1", "w", 8265)
    assert not hasattr(args, "relay_port")
    with pytest.raises(SystemExit) as exited:
        cli.main(["dashboard", "mast", "job1"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "Meta's internal scheduler (MAST)" in err and "danaus.dashboard.serve()" in err


def test_skill_md_names_only_options_the_command_has() -> None:
    """The CLI summary shipped in the package (Monarch's tools/SKILL.md) stays true."""
    import importlib.resources
    import re

    from danaus.tools import cli

    text = importlib.resources.files("danaus.tools").joinpath("SKILL.md").read_text()
    assert "Job reuse:" in text and "--per-host" in text
    parser = cli.get_parser()
    subparsers = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    section = None
    for line in text.splitlines():
        m = re.match(r"(\w+) options:", line)
        if m:
            section = subparsers[m.group(1)]
            continue
        m = re.match(r"\s+(--[\w-]+|-\w)\b", line)
        if section is not None and m:
            assert m.group(1) in section._option_string_actions, (section.prog, m.group(1))
    for command in re.findall(r"^\s+danaus (\w+)", text, flags=re.M):
        assert command in subparsers, command


def test_monarch_home_defaults_and_config_warnings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from danaus.tools.config import defaults
    from danaus.tools.utils import MONARCH_HOME

    monkeypatch.delenv("DANAUS_HOME", raising=False)
    monkeypatch.setenv("MONARCH_HOME", str(tmp_path / "m"))
    assert MONARCH_HOME("conda-pack") == tmp_path / "m" / "conda-pack"
    monkeypatch.setenv("DANAUS_HOME", str(tmp_path / "d"))  # danaus's own wins
    assert MONARCH_HOME() == tmp_path / "d"
    assert defaults.scheduler_factories()["local_cwd"] is ProcessJob
    with pytest.warns(FutureWarning, match="workspace=None"):
        assert Config(workspace=None).workspace.dirs == {}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Config().workspace.dirs == {}  # the default warns nothing
    from danaus.tools.config.environment import CondaEnvironment

    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    with pytest.raises(AssertionError, match="No currently active conda environment"):
        CondaEnvironment().conda_prefix  # noqa: B018  (Monarch asserts: caught as such)
    with pytest.raises(RuntimeError):
        CondaEnvironment().conda_prefix  # noqa: B018
    monkeypatch.setenv("CONDA_PREFIX", "/opt/envs/x")
    assert CondaEnvironment().conda_prefix == "/opt/envs/x"


def test_fuse_mounts_are_refused_naming_what_to_use_instead() -> None:
    job = ProcessJob({"hosts": 1})
    with pytest.raises(NotImplementedError, match=r"no FUSE mounts.*sync_workspace"):
        job.remote_mount("/src/project", mntpoint="/mnt/project")
    with pytest.raises(NotImplementedError, match=r"no FUSE mounts.*danaus exec --all"):
        job.gather_mount("/worker/out", "/local/out")
