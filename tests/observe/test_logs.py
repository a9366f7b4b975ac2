"""Logs: every proc's output reaches the client, prefixed, in order, never blocking a proc.

Real procs throughout. Output printed by the client lands in pytest's capture
(``capsys``); ``logs.flush(procs)`` is the barrier that makes "everything the
procs wrote so far has been printed" true before a test looks, so nothing
here waits on a clock.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import danaus.actor
from danaus._runtime.logs import dirs as logdir
from danaus._runtime.logs import process as logs
from danaus._runtime.node import this_node
from danaus.actor import Actor, MeshFailure, ProcMesh, endpoint, this_host
from danaus.testing import FaultRecorder

from .conftest import proc_names

TIMEOUT = 30.0
REPO = Path(__file__).resolve().parents[2]


class Talker(Actor):
    @endpoint
    def say(self, n: int, tag: str) -> int:
        """``n`` numbered lines to stdout and to stderr through every kind of writer."""
        for i in range(n):
            print(f"{tag} out {i}")
            print(f"{tag} err {i}", file=sys.stderr)
        return n

    @endpoint
    def low_level(self, tag: str) -> None:
        os.write(1, f"{tag} os.write to fd 1\n".encode())
        os.write(2, f"{tag} os.write to fd 2\n".encode())
        subprocess.run(["echo", f"{tag} from a subprocess"], check=True)
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.printf(f"{tag} printf from C\n".encode())

    @endpoint
    def log(self, tag: str) -> None:
        lg = logging.getLogger("user.app")
        lg.debug("%s debug record", tag)
        lg.info("%s info record", tag)
        lg.warning("%s warning record", tag)

    @endpoint
    def steps(self, n: int) -> None:
        rank = danaus.actor.current_rank()["gpus"]
        for i in range(n):
            print(f"step {i} rank {rank} loss {i * 0.5 + rank}")
        print("a line like no other")

    @endpoint
    def crash(self, n: int) -> None:
        for i in range(n):
            print(f"before the crash {i}")
        os.write(2, b"the very last words\n")
        os._exit(3)


def _flush(pm: ProcMesh) -> None:
    logs.flush(this_node(), list(pm._procs), TIMEOUT).result(TIMEOUT)


@pytest.fixture(scope="module")
def logtrainer() -> Iterable[tuple[ProcMesh, Any]]:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name="logtrainer")
    talkers = pm.spawn("talkers", Talker)
    talkers.initialized.get(timeout=TIMEOUT)
    yield pm, talkers
    pm.stop().get(timeout=TIMEOUT)


@pytest.fixture
def unaggregated(logtrainer: tuple[ProcMesh, Any]) -> Iterable[tuple[ProcMesh, Any]]:
    pm, talkers = logtrainer
    pm.logging_option(stream_to_client=True, aggregate_window_sec=None)
    yield pm, talkers
    pm.logging_option()  # Monarch's defaults again


def _numbers(text: str, prefix: str) -> list[int]:
    return [int(m) for m in re.findall(rf"^{re.escape(prefix)} (\d+)$", text, re.M)]


def test_lines_reach_the_client_prefixed_and_in_order_per_proc_and_stream(
    unaggregated: tuple[ProcMesh, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    pm, talkers = unaggregated
    assert talkers.say.call(300, "ordered").get(timeout=TIMEOUT).values() == [300, 300]
    _flush(pm)
    out, err = capsys.readouterr()
    for gpu in (0, 1):
        assert _numbers(out, f"[logtrainer {{gpus={gpu}}}] ordered out") == list(range(300))
        assert _numbers(err, f"[logtrainer {{gpus={gpu}}}] ordered err") == list(range(300))
    assert "ordered err" not in out and "ordered out" not in err


def test_output_is_captured_at_the_file_descriptor_level(
    unaggregated: tuple[ProcMesh, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    pm, talkers = unaggregated
    talkers.slice(gpus=1).low_level.call_one("fd").get(timeout=TIMEOUT)
    _flush(pm)
    out, err = capsys.readouterr()
    assert "[logtrainer {gpus=1}] fd os.write to fd 1\n" in out
    assert "[logtrainer {gpus=1}] fd from a subprocess\n" in out
    assert "[logtrainer {gpus=1}] fd printf from C\n" in out
    assert "[logtrainer {gpus=1}] fd os.write to fd 2\n" in err
    assert "{gpus=0}] fd" not in out + err


def test_logging_records_are_forwarded_and_level_filters_them(
    unaggregated: tuple[ProcMesh, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    pm, talkers = unaggregated
    one = talkers.slice(gpus=0)
    one.log.call_one("default").get(timeout=TIMEOUT)  # level=INFO
    pm.logging_option(aggregate_window_sec=None, level=logging.WARNING)
    one.log.call_one("warning").get(timeout=TIMEOUT)
    pm.logging_option(aggregate_window_sec=None, level=logging.DEBUG)
    one.log.call_one("debug").get(timeout=TIMEOUT)
    _flush(pm)
    err = capsys.readouterr().err
    p = "[logtrainer {gpus=0}]"
    # Monarch's prefix of actor records: the actor's class with its module, as Monarch's.
    a = f"[actor=<root>.<{Talker.__module__}.Talker talkers{{'gpus': 0/2}}>] "
    assert f"{p} INFO user.app: {a}default info record\n" in err
    assert f"{p} WARNING user.app: {a}default warning record\n" in err
    assert "default debug record" not in err
    assert f"{p} WARNING user.app: {a}warning warning record\n" in err
    assert "warning info record" not in err
    assert f"{p} DEBUG user.app: {a}debug debug record\n" in err


def test_logging_option_rejects_bad_values_naming_them(
    logtrainer: tuple[ProcMesh, Any],
) -> None:
    pm, _ = logtrainer
    with pytest.raises(ValueError, match="Invalid logging level: 300"):
        pm.logging_option(level=300)
    with pytest.raises(ValueError, match=r"aggregate_window_sec .* got -1"):
        pm.logging_option(aggregate_window_sec=-1)
    with pytest.raises(TypeError, match="stream_to_client must be True or False"):
        pm.logging_option(stream_to_client="yes")  # type: ignore[arg-type]


def test_stream_to_client_false_keeps_output_off_the_client_but_in_the_files(
    logtrainer: tuple[ProcMesh, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    pm, talkers = logtrainer
    pm.logging_option(stream_to_client=False)
    try:
        talkers.say.call(3, "quiet").get(timeout=TIMEOUT)
        _flush(pm)
        out, err = capsys.readouterr()
        assert "quiet" not in out + err
        files = _job_files()
        assert any("quiet out 2" in Path(p.path).read_text() for p in files)
    finally:
        pm.logging_option()


def test_a_flush_before_the_procs_opened_their_pipes_leaves_their_output_captured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A pipe its proc has not opened yet reads as EOF; the flush must not take that for
    the end (closing it left the proc blocked at start-up, opening it)."""
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="early")
    try:
        _flush(pm)  # spawn_procs has returned; the proc is still starting
        talkers = pm.spawn("early_talkers", Talker)
        assert talkers.say.call_one(2, "early").get(timeout=TIMEOUT) == 2
        _flush(pm)
        assert "early out 0" in capsys.readouterr().out
    finally:
        pm.stop().get(timeout=TIMEOUT)


def test_aggregation_collapses_lines_that_differ_only_in_numbers(
    logtrainer: tuple[ProcMesh, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    pm, talkers = logtrainer
    pm.logging_option(aggregate_window_sec=3)  # the window ends early at the flush
    talkers.steps.call(10).get(timeout=TIMEOUT)
    _flush(pm)
    out = capsys.readouterr().out
    similar = re.findall(
        r"^\[(\d+) similar lines\] \[logtrainer \{gpus=\d\}\] step 0 rank \d", out, re.M
    )
    assert similar == ["20"], out
    # Lines with no similar ones print as they are; the two procs' identical lines group.
    assert re.search(
        r"^\[2 similar lines\] \[logtrainer \{gpus=\d\}\] a line like no other$", out, re.M
    )
    assert "step 5" not in out


def test_a_crashed_procs_last_lines_are_in_its_mesh_failure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = FaultRecorder()
    monkeypatch.setattr(danaus.actor, "unhandled_fault_hook", faults)
    pm = this_host().spawn_procs(per_host={"gpus": 1}, name="doomed")
    pm.logging_option(aggregate_window_sec=None)
    victim = pm.spawn("victim", Talker)
    with pytest.raises(danaus.actor.SupervisionError):
        victim.crash.call_one(100).get(timeout=TIMEOUT)
    failure: MeshFailure = faults.wait()[0]
    assert failure.log_tail[-1] == "the very last words"
    assert failure.log_tail[-2] == "before the crash 99"
    assert "the very last words" in failure.report()
    assert "exited with code 3" in failure.reason
    pm.stop().get(timeout=TIMEOUT)
    # Forwarded to the client as well, every line.
    out = capsys.readouterr().out
    assert _numbers(out, "[doomed {gpus=0}] before the crash") == list(range(100))


def _job_files() -> list[logdir.ProcLog]:
    rt = this_node(start=False).runtime
    assert rt is not None
    return logdir.read_procs(logdir.find_job(rt.proc_id.name))


def _danaus(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.Popen(
        [sys.executable, "-m", "danaus", *args],  # the `danaus` command
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_every_proc_has_a_log_file_that_danaus_logs_prints_filtered(
    logtrainer: tuple[ProcMesh, Any],
) -> None:
    pm, talkers = logtrainer
    talkers.say.call(2, "filed").get(timeout=TIMEOUT)
    _flush(pm)
    files = {p.coords: p for p in _job_files() if p.label == "logtrainer"}
    assert set(files) == {"gpus=0", "gpus=1"}
    for coords, p in files.items():
        text = Path(p.path).read_text()
        assert "filed out 1\n" in text and "filed err 1\n" in text, coords
        meta = json.loads(Path(p.path[: -len(".log")] + ".json").read_text())
        assert meta["label"] == "logtrainer" and isinstance(meta["pid"], int)
        assert os.stat(p.path).st_mode & 0o077 == 0  # private to the user
    rt = this_node(start=False).runtime
    assert rt is not None
    cli = _danaus("logs", rt.proc_id.name, "--mesh", "logtrainer", "-c", "gpus=1")
    out, err = cli.communicate(timeout=TIMEOUT)
    assert cli.returncode == 0, err
    assert "[logtrainer {gpus=1}] filed out 1\n" in out
    assert "{gpus=0}" not in out
    cli = _danaus("logs", rt.proc_id.name, "--mesh", "nosuchmesh")
    _, err = cli.communicate(timeout=TIMEOUT)
    assert cli.returncode == 1 and "no proc matches" in err
    cli = _danaus("logs", rt.proc_id.name, "-c", "gpus")
    _, err = cli.communicate(timeout=TIMEOUT)
    assert cli.returncode == 2 and "bad coordinate 'gpus'" in err


def test_danaus_logs_follow_prints_new_lines_as_they_come(
    logtrainer: tuple[ProcMesh, Any],
) -> None:
    pm, talkers = logtrainer
    talkers.say.call(1, "before-follow").get(timeout=TIMEOUT)
    _flush(pm)
    rt = this_node(start=False).runtime
    assert rt is not None
    cli = _danaus("logs", rt.proc_id.name, "-f", "-n", "1", "-c", "gpus=0", "-m", "logtrainer")
    try:
        assert cli.stdout is not None
        first = cli.stdout.readline()  # the last line so far: it is following now
        assert first.startswith("[logtrainer {gpus=0}] before-follow "), first
        talkers.say.call(1, "followed").get(timeout=TIMEOUT)
        seen = []
        for line in cli.stdout:  # bounded by the test's timeout
            seen.append(line)
            if "followed out 0" in line:
                break
        assert "[logtrainer {gpus=0}] followed out 0\n" in seen
        assert not any("before-follow" in line or "gpus=1" in line for line in seen)
    finally:
        cli.kill()
        cli.communicate()


class Spammer(Actor):
    """Prints in a thread of its own, at full speed, until told to stop and a quota is met."""

    def __init__(self) -> None:
        self.printed = 0
        self.stop_asked = threading.Event()
        self.thread: threading.Thread | None = None

    @endpoint
    def start(self, nbytes: int) -> None:
        rank = danaus.actor.current_rank()["gpus"]

        def run() -> None:
            pad = "x" * 80
            written = 0
            write = sys.stdout.write
            while written < nbytes:
                line = f"{self.printed:09d} {rank} {pad}\n"
                write(line)
                written += len(line)
                self.printed += 1
            sys.stdout.flush()
            # Exactly nbytes (so how much is in flight does not depend on how
            # fast the machine runs the pings), then idle until finish().
            self.stop_asked.wait()

        self.thread = threading.Thread(target=run)
        self.thread.start()

    @endpoint
    def ping(self) -> bool:
        """Answered while the printing goes on; True while it does."""
        return self.thread is not None and self.thread.is_alive()

    @endpoint
    def finish(self) -> int:
        self.stop_asked.set()
        assert self.thread is not None
        self.thread.join()
        return self.printed


class _BlockedStdout:
    """A terminal that prints nothing until released: the client falls behind."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.text: list[str] = []

    def write(self, s: str) -> int:
        self.release.wait(TIMEOUT * 10)
        if "dropped" in s:
            self.text.append(s)
        return len(s)

    def flush(self) -> None:
        pass


def _heavy_output(nbytes: int, monkeypatch: pytest.MonkeyPatch, block: bool) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 8}, name="spam")
    names: list[str] = []
    try:
        names = proc_names(procs)  # in rank order, as the values of a call
        procs.logging_option(aggregate_window_sec=None)
        spam = procs.spawn("spam", Spammer)
        stdout = _BlockedStdout()
        if block:
            monkeypatch.setattr(sys, "stdout", stdout)
        else:
            stdout.release.set()
            monkeypatch.setattr(sys, "stdout", stdout)
        before = {name: logs.statistics(this_node(), name) for name in names}
        spam.start.call(nbytes // 8).get(timeout=TIMEOUT)
        # The procs keep answering calls while they print (and while the client is stuck).
        for _ in range(5):
            assert all(spam.ping.call().get(timeout=TIMEOUT).values())
        printed = list(spam.finish.call().get(timeout=TIMEOUT * 4).values())
        stdout.release.set()
        _flush(procs)
        for i, name in enumerate(names):
            st, old = logs.statistics(this_node(), name), before[name]
            got = (st.lines - old.lines) + (st.dropped - old.dropped)
            assert got == printed[i], f"proc {i}: {st} for {printed[i]} lines printed"
        dropped = sum(logs.statistics(this_node(), n).dropped - before[n].dropped for n in names)
        if block:
            # The client was stuck: agents hit their bound, dropped lines and said so.
            assert dropped > 0
            assert any("lines of stdout dropped" in t for t in stdout.text)
        else:
            assert dropped == 0
        # The files on the host have every line, dropped or not.
        files = {p.proc: p for p in _job_files()}
        for i, name in enumerate(names):
            with open(files[name].path, "rb") as f:
                lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
            assert lines == printed[i]
    finally:
        procs.stop().get(timeout=TIMEOUT)
        for p in _job_files():
            if p.proc in names:
                os.unlink(p.path)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_200_mb_from_8_procs_arrive_or_are_counted_and_procs_keep_answering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _heavy_output(200 << 20, monkeypatch, block=True)


@pytest.mark.timeout(120)
def test_heavy_output_reaches_a_client_that_keeps_up_in_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _heavy_output(16 << 20, monkeypatch, block=False)


_FALLING_BEHIND = """
import json, sys, threading
from danaus._runtime.logs import process as logs
from danaus._runtime.node import this_node
from danaus.actor import Actor, endpoint, this_host


class Spammer(Actor):
    def __init__(self):
        self.printed, self.stop_asked, self.thread = 0, threading.Event(), None

    @endpoint
    def start(self, nbytes):
        def run():
            written = 0
            while written < nbytes or not self.stop_asked.is_set():
                line = f"{self.printed:09d} {'x' * 80}\\n"
                sys.stdout.write(line)
                written += len(line)
                self.printed += 1
            sys.stdout.flush()

        self.thread = threading.Thread(target=run)
        self.thread.start()

    @endpoint
    def ping(self):
        return self.thread.is_alive()

    @endpoint
    def finish(self):
        self.stop_asked.set()
        self.thread.join()
        return self.printed


class Stuck:
    def __init__(self):
        self.release, self.notes = threading.Event(), []

    def write(self, s):
        self.release.wait(300)
        self.notes += [line for line in s.splitlines() if "dropped" in line]
        return len(s)

    def flush(self):
        pass


procs = this_host().spawn_procs(per_host={"gpus": 4}, name="spam")
procs.logging_option(aggregate_window_sec=None)
spam = procs.spawn("spam", Spammer)
spam.initialized.get(timeout=30)
real, sys.stdout = sys.stdout, Stuck()
spam.start.call(1 << 20).get(timeout=30)
pings = [all(spam.ping.call().get(timeout=30).values()) for _ in range(5)]
printed = list(spam.finish.call().get(timeout=60).values())
sys.stdout.release.set()
logs.flush(this_node(), list(procs._procs), 60).result(60)
stats = [logs.statistics(this_node(), p.proc) for p in procs.stats().get(timeout=30).procs]
real.write(json.dumps({
    "pings": pings, "printed": printed, "notes": sys.stdout.notes,
    "received": [s.lines for s in stats], "dropped": [s.dropped for s in stats],
}) + "\\n")
"""


@pytest.mark.timeout(120)
def test_a_client_that_falls_behind_is_told_how_many_lines_were_dropped(
    tmp_path: Path,
) -> None:
    from danaus.testing import ClientScript, client_env

    script = ClientScript(tmp_path).write(_FALLING_BEHIND)
    env = {
        **client_env(),
        "DANAUS_LOG_FORWARD_WINDOW": "16KiB",
        "DANAUS_LOG_FORWARD_BUFFER": "64KiB",
    }
    r = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=110
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["pings"] == [True] * 5  # answered while printing, with the client stuck
    for printed, received, dropped in zip(
        result["printed"], result["received"], result["dropped"], strict=True
    ):
        assert received + dropped == printed
        assert dropped > 0
    assert len(result["notes"]) >= 4
    assert re.match(r"\[spam \{gpus=\d\}\] \[\d+ lines of stdout dropped", result["notes"][0])


_DIAGNOSTICS = """
import logging, sys
from danaus._runtime.logs import dirs as logdir
from danaus._runtime.node import this_node
from danaus.actor import this_host

procs = this_host().spawn_procs(per_host={"gpus": 1})
procs.logging_option()  # also works on this_proc(): nothing to capture there
from danaus.actor import this_proc
this_proc().logging_option(level=logging.DEBUG)
procs.initialized.get(timeout=30)
logging.getLogger("danaus.test").warning("a diagnostic for the file only")
logging.getLogger("danaus.test").error("an error the user needs")
print(logdir.find_job(this_node(start=False).runtime.proc_id.name))
procs.stop().get(timeout=30)
"""


def test_danaus_diagnostics_go_to_its_log_file_and_only_errors_to_the_terminal(
    tmp_path: Path,
) -> None:
    from danaus.testing import ClientScript, client_env

    script = ClientScript(tmp_path).write(_DIAGNOSTICS)
    r = subprocess.run(
        [sys.executable, str(script)],
        env=client_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "a diagnostic for the file only" not in r.stderr
    assert "an error the user needs" in r.stderr
    assert "no handler" not in r.stderr
    text = (Path(r.stdout.strip().splitlines()[-1]) / "danaus.log").read_text()
    assert "WARNING: a diagnostic for the file only" in text
    assert "ERROR: an error the user needs" in text
    assert "no handler for frame kind" not in text
