"""The ``danaus`` command, in this process: what its parser accepts and refuses, how it
finds the dashboard's token, and the text tables ``query`` and ``top`` print."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from danaus._cli import observe
from danaus._cli.main import build_parser


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_every_command_is_a_subcommand_of_one_parser() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"worker", "apply", "kill", "exec", "shell", "context", "logs", "debug"} <= set(
        sub.choices
    )
    with pytest.raises(SystemExit) as info:
        parser.parse_args([])  # a command is required
    assert info.value.code == 2


def test_worker_needs_an_address_and_keeps_its_flags() -> None:
    args = _parse("worker", "--listen", "tcp://0.0.0.0:0", "--insecure", "--secret-file", "-")
    assert (args.command, args.listen, args.insecure, args.secret_file, args.detach) == (
        "worker", "tcp://0.0.0.0:0", True, "-", False,
    )  # fmt: skip
    with pytest.raises(SystemExit):
        _parse("worker")


def test_exec_refuses_all_with_mesh_in_either_order_saying_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["--all", "--mesh", "m"], ["--mesh", "m", "--all"]):
        with pytest.raises(SystemExit):
            _parse("exec", *argv, "--", "hostname")
        assert "--all and --mesh cannot go together" in capsys.readouterr().err
    args = _parse("exec", "--mesh", "m", "--one", "-e", "A=1", "-e", "B=2", "--", "ls", "-l")
    assert (args.mesh, args.one, args.env) == ("m", True, ["A=1", "B=2"])
    assert args.cmd == ["--", "ls", "-l"]
    assert _parse("exec", "--all", "--", "ls").run_all is True


def test_context_verbs_take_a_name_except_ls() -> None:
    assert _parse("context", "use", "exp1").name == "exp1"
    assert _parse("context", "ls").context_command == "ls"
    with pytest.raises(SystemExit):
        _parse("context", "create")


def _dash_args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"token_file": None, "url": None, "command": "top", **kw})


def test_the_dashboard_token_comes_from_the_file_the_url_or_the_environment(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(observe.TOKEN_ENV, raising=False)
    url = "http://127.0.0.1:8265/?view=x"
    with pytest.raises(observe.DashboardError, match=f"carries no token.*{observe.TOKEN_ENV}"):
        observe.dashboard_url(_dash_args(url=url))
    monkeypatch.setenv(observe.TOKEN_ENV, "from-env")
    assert observe.dashboard_url(_dash_args(url=url)).endswith("view=x&token=from-env")
    path = tmp_path / "token"
    path.write_text("from-file\n")
    path.chmod(0o600)
    got = observe.dashboard_url(_dash_args(url=url, token_file=str(path)))
    assert got.endswith("token=from-file")  # the file wins over the environment
    # a token in the URL works, with a warning that others can read it
    assert observe.dashboard_url(_dash_args(url=url + "&token=t1")).endswith("token=t1")
    assert "visible to every user of this machine" in capsys.readouterr().err
    path.chmod(0o644)  # others may read it: refused
    with pytest.raises(observe.DashboardError, match="cannot read the token from --token-file"):
        observe.dashboard_url(_dash_args(url=url, token_file=str(path)))


def test_a_query_result_prints_aligned_with_numbers_to_the_right() -> None:
    text = observe.text_table(["name", "n"], [["a", 1], ["long-name", 12.5], ["b", None]])
    lines = text.splitlines()
    assert lines[0] == "name          n"
    assert lines[2:5] == ["a             1", "long-name  12.5", "b          NULL"]
    assert lines[-1] == "(3 rows)"
    assert observe.text_table(["x"], []) == "(no rows)"
    assert observe.text_table(["x"], [[1]]).endswith("(1 row)")


def test_top_shows_one_row_per_actor_and_one_per_proc_without_actors() -> None:
    ep = {"calls": 3, "errors": 1, "p50_s": 0.0004, "p99_s": 0.25}
    idle = {**ep, "calls": 1, "errors": 0, "p99_s": None}
    actor = {"actor": "w[0]", "class": "m.W", "received": 5, "rate": 2.0, "queued": 1,
             "endpoints": {"step": ep, "idle": idle}}  # fmt: skip
    state = {
        "client": {"proc": "client", "pid": 42},
        "totals": {"procs": 2, "alive": 1, "actors": 1, "calls": 4, "errors": 1, "rate": 2.0},
        "hosts": [{"procs": [
            {"proc": "p0", "coords": {"gpus": 0}, "state": "alive", "actors": [actor]},
            {"proc": "p1", "coords": {"gpus": 1}, "state": "lost", "actors": [], "parent": "p0"},
        ]}],
        "failures": [{"actor": "v[1]", "proc": "p1", "reason": "killed by SIGKILL"}],
        "restarts": [{"time": 0.0, "child": "w", "ranks": [0], "supervisor": "s",
                      "reason": "crash"}],
    }  # fmt: skip
    rows = observe.rows(state)
    assert rows[0] == ["p0 {gpus=0}", "alive", "w[0]", "m.W", "5", "2.0", "1", "4", "1",
                       "400us", "250.0ms"]  # fmt: skip
    assert rows[1][:4] == ["  p1 {gpus=1} in p0", "lost", "-", "-"]
    text = observe.plain(state)
    assert text.startswith("danaus top - client client (pid 42) - 2 procs (1 alive)")
    assert "FAILED v[1] on proc p1: killed by SIGKILL" in text
    assert "RESTARTED w[0] by supervisor 's' at " in text and text.endswith(": crash")
