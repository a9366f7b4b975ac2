"""The distributed debugger, driven through real pseudo-terminals (pexpect).

A client script (its actor classes live in ``__main__``, so they travel by
value) spawns real procs whose endpoints call ``breakpoint()``; ``danaus
debug`` runs in a second terminal, or the client's own terminal shows the
prompt (the async actor's endpoint uses ``pdb.set_trace()``). Every wait is
an ``expect`` on output, never a sleep: the one loop
re-lists until all sessions have registered, bounded by its count and the
pexpect timeout.
"""

from __future__ import annotations

import io
import os
import re
import signal
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from danaus._actor.debugger import commands as cmds
from danaus.testing import client_env, wait_until

pexpect = pytest.importorskip("pexpect")

EXPECT_TIMEOUT = 60  # a bound on any one prompt; far above what a healthy step needs

CLIENT = """
import asyncio
import pdb
import sys

from danaus.actor import Actor, current_rank, endpoint, this_host


class Debugee(Actor):
    @endpoint
    def to_debug(self, base):
        x = base + current_rank().rank
        breakpoint()
        y = x * 2
        return y

    @endpoint
    def crash(self, n):
        breakpoint()
        boom = n + 1
        _fail(boom)


def _fail(value):
    raise ValueError(f"bad value {value}")


class Neighbour(Actor):
    @endpoint
    def value(self):
        return 7


class AsyncDebugee(Actor):
    @endpoint
    async def work(self, n):
        await asyncio.sleep(0)
        pdb.set_trace()
        z = n * 3
        return z


def say(*words):
    # one write per line: the fault hook prints from another thread, and
    # print() writes its pieces separately, so two prints can interleave
    sys.stdout.write(" ".join(str(w) for w in words) + "\\n")
    sys.stdout.flush()


mode = sys.argv[1]
if mode == "mesh":
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    mesh = procs.spawn("debugee", Debugee)
    say("RESULT", list(mesh.to_debug.call(10).get().values()))
elif mode == "postmortem":
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    crasher = procs.spawn("crasher", Debugee)
    neighbour = procs.spawn("neighbour", Neighbour)
    fut = crasher.crash.call_one(41)
    input()  # the test answers once the session is listed
    say("NEIGHBOUR", neighbour.value.call_one().get(timeout=60))
    try:
        fut.get()
    except Exception as e:
        say("ERROR", type(e).__name__, "bad value 42" in str(e))
elif mode == "lost":
    import danaus.actor

    danaus.actor.unhandled_fault_hook = lambda failure: say("FAULT")
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    doomed = procs.spawn("doomed", Debugee)
    try:
        doomed.to_debug.call_one(1).get()
    except Exception as e:
        say("LOST", type(e).__name__)
    input()  # stay up until the test has listed the sessions
elif mode == "loud":
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    loud = procs.spawn("loud", Debugee)
    say("RESULT", loud.to_debug.call_one(1).get())
elif mode == "terminal":
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    workers = procs.spawn("worker", AsyncDebugee)
    say("RESULT", list(workers.work.call(5).get().values()))
"""

LIST_DONE = re.compile(r"\((\d+) sessions? paused\)|no paused sessions")


@pytest.fixture
def debug_dir() -> Iterator[Path]:
    """A socket directory of this test's own, so `danaus debug` finds only its client.

    Short (under /tmp): a Unix socket path must fit in 108 bytes.
    """
    with tempfile.TemporaryDirectory(prefix="dbg") as d:
        yield Path(d)


def _env(debug_dir: Path, **extra: str) -> dict[str, str]:
    env = client_env()
    env.update(DANAUS_SOCKET_DIR=str(debug_dir / "s"), TERM="dumb", **extra)
    return env


def _spawn(args: list[str], env: dict[str, str], cwd: Path) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        args,
        env=env,
        cwd=str(cwd),
        encoding="utf-8",
        timeout=EXPECT_TIMEOUT,
        dimensions=(50, 200),
    )
    child.delaybeforesend = None  # every send follows the prompt it answers
    # Everything the terminal showed: an expect that fails reports only what
    # followed its last match, and an earlier line (a failure report) may say why.
    child.logfile_read = io.StringIO()
    return child


@pytest.fixture
def session(debug_dir: Path) -> Iterator[dict[str, object]]:
    """Spawned terminals, killed at the end whatever happened."""
    script = debug_dir / "client.py"
    script.write_text(CLIENT)
    children: list[pexpect.spawn] = []
    yield {"dir": debug_dir, "script": script, "children": children}
    for child in children:
        if child.isalive():
            child.terminate(force=True)
        # Shown by pytest only when the test failed (captured output of its teardown).
        args = [a.decode() if isinstance(a, bytes) else a for a in child.args]
        print(f"--- {' '.join(args[1:])}: {_ended(child)}")
        print(child.logfile_read.getvalue())


def _ended(child: pexpect.spawn) -> str:
    child.close(force=True)
    if child.signalstatus is not None:
        return f"killed by signal {child.signalstatus}"
    return f"exit code {child.exitstatus}"


def _client(session: dict[str, object], mode: str, **env: str) -> pexpect.spawn:
    d = session["dir"]
    assert isinstance(d, Path)
    child = _spawn([str(session["script"]), mode], _env(d, **env), d)
    session["children"].append(child)  # type: ignore[attr-defined]
    return child


def _cli(session: dict[str, object]) -> pexpect.spawn:
    d = session["dir"]
    assert isinstance(d, Path)
    child = _spawn(["-m", "danaus", "debug"], _env(d), d)
    session["children"].append(child)  # type: ignore[attr-defined]
    child.expect("DANAUS DEBUGGER")
    child.expect("danaus_dbg> ")
    return child


def _list_until(prompt: pexpect.spawn, n: int) -> str:
    """Send 'list' until it shows ``n`` sessions; the table's text."""

    def listed() -> tuple[int, str]:
        prompt.sendline("list")
        prompt.expect(LIST_DONE)
        table = prompt.before
        found = int(prompt.match.group(1) or 0)
        prompt.expect("danaus_dbg> ")
        return found, str(table)

    # Bounded by time, not by a count of tries: on a loaded machine the actors
    # may take a while to reach their breakpoints.
    _, table = wait_until(
        listed, 60, f"the debugger lists {n} sessions", until=lambda r: r[0] == n, interval=0.05
    )
    return table


def _rows(table: str) -> dict[int, str]:
    """rank -> its row of a 'list' table."""
    rows = {}
    for line in table.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[1].isdigit():
            rows[int(parts[1])] = line
    return rows


@pytest.mark.timeout(240)
def test_list_attach_cast_continue_over_four_procs(session: dict[str, object]) -> None:
    client = _client(session, "mesh", DANAUS_DEBUG_TERMINAL="0", DANAUS_DEBUG_CAST_WAIT="60s")
    client.expect("paused in breakpoint")
    dbg = _cli(session)

    table = _list_until(dbg, 4)
    rows = _rows(table)
    assert sorted(rows) == [0, 1, 2, 3]
    for rank, row in rows.items():  # actor, coordinates, function, file and line
        coords = f"hosts={rank // 2},gpus={rank % 2}"
        assert row.split()[:3] == ["debugee", str(rank), coords], row
        assert "to_debug" in row and "client.py:" in row

    # only this user can reach the prompt: a 0700 job directory, a 0600 socket
    (sock,) = Path(str(session["dir"]), "s").glob("*/debug.sock")
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600

    dbg.sendline("frobnicate")
    dbg.expect("unknown command 'frobnicate'")
    dbg.expect("danaus_dbg> ")
    dbg.sendline("help")
    dbg.expect("cast <actor> ranks")
    dbg.expect("danaus_dbg> ")

    # a full pdb session with rank 1: print, step, continue
    dbg.sendline("attach debugee 1")
    dbg.expect(r"-> y = x \* 2")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("p x")
    dbg.expect(r"\r\n11\r\n")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("n")
    dbg.expect(r"-> return y")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("p y")
    dbg.expect(r"\r\n22\r\n")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("c")
    dbg.expect("ended: its endpoint finished")
    dbg.expect("danaus_dbg> ")

    # cast to a subset by rank list: only those ranks move on
    dbg.sendline("cast debugee ranks(0,2) n")
    dbg.expect("sent 'n' to debugee 0, debugee 2")
    dbg.expect("danaus_dbg> ")
    rows = _rows(_list_until(dbg, 3))
    line_of = {rank: int(row.rsplit(":", 1)[1]) for rank, row in rows.items()}
    assert line_of[0] == line_of[2] == line_of[3] + 1, rows

    # cast by coordinates; its output is kept for the next attach
    dbg.sendline("cast debugee ranks(hosts=1) p x + 1000")
    dbg.expect("sent 'p x \\+ 1000' to debugee 2, debugee 3")
    dbg.expect("danaus_dbg> ")
    dbg.sendline("attach debugee 3")
    dbg.expect(r"1013\r\n")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("detach")
    dbg.expect("detached from debugee 3")
    dbg.expect("danaus_dbg> ")
    _list_until(dbg, 3)  # detached, still paused

    dbg.sendline("cast debugee ranks(0:8:2) p 'even'")  # a range: ranks 0 and 2
    dbg.expect("sent .* to debugee 0, debugee 2 ")
    dbg.expect("danaus_dbg> ")

    dbg.sendline("continue")
    dbg.expect("sent 'clear ;; c' to debugee 0, debugee 2, debugee 3")
    client.expect(r"RESULT \[20, 22, 24, 26\]")
    dbg.expect("danaus_dbg> ")
    dbg.sendline("quit")
    dbg.expect("leaving the debugger")
    dbg.expect(pexpect.EOF)
    client.expect(pexpect.EOF)
    assert "Traceback" not in client.before  # the controller stopped cleanly at exit
    client.close()
    assert client.exitstatus == 0


@pytest.mark.timeout(180)
def test_post_mortem_after_breakpoint_while_a_neighbour_actor_keeps_answering(
    session: dict[str, object],
) -> None:
    client = _client(session, "postmortem", DANAUS_DEBUG_TERMINAL="0")
    client.expect("paused in breakpoint")
    dbg = _cli(session)
    assert "crasher" in _rows(_list_until(dbg, 1))[0]

    # another actor of the same proc answers while this one is paused
    client.sendline("go")
    client.expect("NEIGHBOUR 7")

    dbg.sendline("attach crasher 0")
    dbg.expect(r"-> boom = n \+ 1")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("c")  # runs into the exception: post-mortem
    dbg.expect("post-mortem: the endpoint raised ValueError: bad value 42")
    dbg.expect(r"-> raise ValueError")  # where it raised, in a function the endpoint called
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("p value")
    dbg.expect(r"\r\n42\r\n")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("up")
    dbg.expect(r"-> _fail\(boom\)")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("p n")
    dbg.expect(r"\r\n41\r\n")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("down")
    dbg.expect(r"-> raise ValueError")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("c")
    dbg.expect("ended: its endpoint finished")
    dbg.expect("danaus_dbg> ")
    client.expect("ERROR ActorError True")
    client.expect(pexpect.EOF)
    assert "Traceback" not in client.before
    dbg.sendline("quit")
    dbg.expect(pexpect.EOF)


@pytest.mark.timeout(180)
def test_the_clients_own_terminal_debugs_async_actors_until_danaus_debug_takes_over(
    session: dict[str, object],
) -> None:
    client = _client(session, "terminal")
    client.expect("use the prompt below")
    client.expect("danaus_dbg> ")
    _list_until(client, 2)
    client.sendline("attach worker 0")
    client.expect(r"-> z = n \* 3")
    client.expect(r"\(Pdb\) ")
    client.sendline("p n")
    client.expect(r"\r\n5\r\n")
    client.expect(r"\(Pdb\) ")
    client.sendline("c")
    client.expect("danaus_dbg> ")

    # `danaus debug` takes the prompt over; the terminal gets it back when it quits
    dbg = _cli(session)
    client.expect("another danaus debug took over")
    assert "worker" in _rows(_list_until(dbg, 1))[1]
    dbg.sendline("quit")
    dbg.expect(pexpect.EOF)
    client.expect("DANAUS DEBUGGER")
    client.expect("danaus_dbg> ")

    client.sendline("continue")
    # Two threads write these: the prompt's closing line (the debugger, once the
    # last session ended) and the program's own line (its main thread, once the
    # results arrived). Either may come first.
    said = [r"no paused sessions left; the program goes on", r"RESULT \[15, 15\]"]
    seen = {client.expect(said)}
    seen.add(client.expect(said))
    assert seen == {0, 1}
    client.expect(pexpect.EOF)
    assert "Traceback" not in client.before


@pytest.mark.timeout(180)
def test_a_lost_proc_drops_its_session_and_its_caller_hears(session: dict[str, object]) -> None:
    client = _client(session, "lost", DANAUS_DEBUG_TERMINAL="0")
    client.expect("paused in breakpoint")
    dbg = _cli(session)
    _list_until(dbg, 1)
    dbg.sendline("attach doomed 0")
    dbg.expect(r"pid (\d+)\)")
    pid = int(dbg.match.group(1))
    dbg.expect(r"\(Pdb\) ")
    os.kill(pid, signal.SIGKILL)
    dbg.sendline("p 1")  # the session's proc is gone: the prompt says so, nothing hangs
    dbg.expect("ended: its proc was lost")
    dbg.expect("danaus_dbg> ")
    _list_until(dbg, 0)
    client.expect("LOST SupervisionError")
    client.sendline("")
    client.expect(pexpect.EOF)
    dbg.sendline("quit")
    dbg.expect(pexpect.EOF)


def test_danaus_debug_without_a_client_says_so(debug_dir: Path) -> None:
    cli = _spawn(["-m", "danaus", "debug"], _env(debug_dir), debug_dir)
    cli.expect("no running danaus client has a paused actor")
    cli.expect(pexpect.EOF)
    cli.close()
    assert cli.exitstatus == 2


# -- the prompt's syntax (pure) --------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("list", cmds.ListSessions()),
        ("l", cmds.ListSessions()),
        ("attach trainer 3", cmds.Attach("trainer", 3)),
        ("a trainer-1a2b 0", cmds.Attach("trainer-1a2b", 0)),
        ("cast t ranks(3) n", cmds.Cast("t", 3, "n")),
        ("cast t ranks(1,2, 5) p x, y", cmds.Cast("t", (1, 2, 5), "p x, y")),
        ("cast t ranks(0:8:2) s", cmds.Cast("t", range(0, 8, 2), "s")),
        ("cast t ranks(:4) c", cmds.Cast("t", range(0, 4), "c")),
        (
            "cast t ranks(hosts=1, gpus=(0,2), z=1:3) until 30",
            cmds.Cast("t", {"hosts": 1, "gpus": (0, 2), "z": range(1, 3)}, "until 30"),
        ),
        ("continue", cmds.Continue()),
        ("c", cmds.Continue()),
        ("detach", cmds.Detach()),
        ("help", cmds.Help()),
        ("quit", cmds.Quit()),
        ("   ", None),
    ],
)
def test_commands_parse_as_monarch_writes_them(line: str, command: cmds.Command | None) -> None:
    assert cmds.parse(line) == command


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("launch", "unknown command 'launch'"),
        ("attach trainer", "usage: attach <actor> <rank>"),
        ("attach trainer x", "usage: attach <actor> <rank>"),
        ("cast trainer n", "usage: cast <actor> ranks"),
        ("cast trainer ranks(1,2 n", "unclosed 'ranks('"),
        ("cast trainer ranks(1)", "no pdb command"),
        ("cast trainer ranks() n", "ranks() is empty"),
        ("cast trainer ranks(a) n", "cannot read 'a' as ranks"),
        ("cast trainer ranks(0:4:0) n", "the step of '0:4:0' is 0"),
        ("cast trainer ranks(gpus=1, gpus=2) n", "dimension 'gpus' is given twice"),
        ("list all", "'list' takes no arguments"),
    ],
)
def test_bad_commands_say_what_to_type(line: str, message: str) -> None:
    with pytest.raises(cmds.CommandError, match=re.escape(message)):
        cmds.parse(line)


def test_selections_choose_by_rank_range_list_and_coordinates() -> None:
    coords = {"hosts": 1, "gpus": 2}
    assert cmds.select(6, coords, 6) and not cmds.select(5, coords, 6)
    assert cmds.select(6, coords, (1, 6)) and not cmds.select(6, coords, (1, 5))
    assert cmds.select(6, coords, range(0, 8, 2)) and not cmds.select(6, coords, range(1, 8, 2))
    assert cmds.select(6, coords, {"hosts": 1, "gpus": range(2, 4)})
    assert not cmds.select(6, coords, {"hosts": 0})
    assert not cmds.select(6, coords, {"racks": 0})  # a dimension the session lacks


def test_debug_controller_serves_only_source_files_the_client_has_loaded() -> None:
    from danaus.actor import debug_controller

    controller = debug_controller()
    assert controller.sessions.call_one().get(timeout=EXPECT_TIMEOUT) == []
    own = cmds.__file__
    text = controller.source.call_one(own).get(timeout=EXPECT_TIMEOUT)
    assert text == Path(own).read_text()
    assert controller.source.call_one("/etc/passwd").get(timeout=EXPECT_TIMEOUT) is None
    assert debug_controller().sessions.call_one().get(timeout=EXPECT_TIMEOUT) == []  # the same one


def test_a_sessions_output_keeps_its_last_part_and_says_how_much_was_dropped() -> None:
    from danaus._actor.debugger.session import OutputRing

    ring = OutputRing(limit=10)
    ring.append("0123456789")
    assert ring.since() == "0123456789"
    ring.append("abcde")  # 15 written, 10 kept
    out = ring.since()
    assert out.endswith("\n56789abcde") and out.startswith("[... 5 characters of debugger")
    assert "debug_output_max" in out
    assert ring.since(12) == "cde"  # from a position still kept: no marker
    assert ring.since(2).startswith("[... 3 characters") and ring.since(2).endswith("56789abcde")
    ring.clear()
    assert ring.since() == "" and ring.since(3) == ""
    ring.append("x" * 3000)  # one write larger than the bound
    assert (
        ring.since() == "[... 2.9 KiB of debugger output dropped: a session keeps "
        "the last 10 characters (setting debug_output_max) ...]\n" + "x" * 10
    )
    big = OutputRing(limit=2048)
    for _ in range(4096):  # a session that prints forever holds at most its bound
        big.append("y" * 1000)
    assert big._size == 2048 and len(big._parts) <= 3
    assert big.since().startswith("[... 3.9 MiB of debugger output dropped")


@pytest.mark.timeout(120)
def test_a_pdb_command_that_prints_too_much_shows_its_tail_and_a_marker(
    session: dict[str, object],
) -> None:
    client = _client(session, "loud", DANAUS_DEBUG_TERMINAL="0", DANAUS_DEBUG_OUTPUT_MAX="4KiB")
    client.expect("paused in breakpoint")
    dbg = _cli(session)
    _list_until(dbg, 1)
    dbg.sendline("attach loud 0")
    dbg.expect(r"\(Pdb\) ")
    dbg.sendline("p 'ab' * 100000 + 'THE-END'")
    dbg.expect(
        r"\[\.\.\. (\d+\.\d) KiB of debugger output dropped: a session keeps the last "
        r"4\.0 KiB \(setting debug_output_max\) \.\.\.\]"
    )
    dropped_kib = float(dbg.match.group(1))
    assert 190 < dropped_kib < 200  # 200,009 characters printed, 4 KiB kept
    dbg.expect(r"abababTHE-END'\r\n")
    dbg.expect(r"\(Pdb\) ")
    assert len(dbg.before) < 100  # nothing after the tail but the prompt
    dbg.sendline("c")
    client.expect(r"RESULT 2")
    dbg.expect("danaus_dbg> ")
    dbg.sendline("quit")
    dbg.expect(pexpect.EOF)


@pytest.mark.timeout(120)
def test_a_client_exits_quietly_after_a_breakpoint_while_danaus_debug_is_attached(
    session: dict[str, object],
) -> None:
    """The debugger's socket server, its connection's task and its prompt task end with the
    client: no "Task was destroyed but it is pending!" at exit, and `danaus debug` hears why."""
    client = _client(session, "loud", DANAUS_DEBUG_TERMINAL="0")
    client.expect("paused in breakpoint")
    dbg = _cli(session)
    _list_until(dbg, 1)
    dbg.sendline("continue")  # `danaus debug` stays connected while the client exits
    dbg.expect("sent 'clear ;; c' to loud 0")
    client.expect(r"RESULT 2")
    client.expect(pexpect.EOF)
    out = client.before
    client.close()
    assert client.exitstatus == 0, out
    for noise in ("Task was destroyed", "Exception ignored", "Traceback"):
        assert noise not in out, out
    dbg.sendline("list")  # its prompt was waiting for a line: now it hears why it ends
    dbg.expect("the program exited")
    dbg.expect(pexpect.EOF)
    assert "Traceback" not in dbg.before
