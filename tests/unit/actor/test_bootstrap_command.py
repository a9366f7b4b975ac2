"""``BootstrapCommand`` and ``default_bootstrap_cmd()`` as values, and what
``spawn_procs(bootstrap_command=...)`` and ``with_python_executable`` refuse before
starting anything (issue 28). Procs started by a command:
``tests/integration/test_bootstrap_command.py``."""

from __future__ import annotations

import pickle
import sys

import pytest

from danaus.actor import BootstrapCommand, default_bootstrap_cmd, this_host

# -- the command object -----------------------------------------------------------


def test_bootstrap_command_holds_its_parts_merges_env_into_a_copy_and_pickles() -> None:
    cmd = BootstrapCommand("/bin/prog", None, ["-x", "y"], {"A": "1", "B": "2"})
    assert (cmd.program, cmd.arg0, cmd.args, cmd.env) == (
        "/bin/prog",
        None,
        ["-x", "y"],
        {"A": "1", "B": "2"},
    )
    merged = cmd.with_env({"B": "3", "C": "4"})
    assert merged.env == {"A": "1", "B": "3", "C": "4"}
    assert cmd.env == {"A": "1", "B": "2"}  # the original is unchanged
    assert merged != cmd and merged == BootstrapCommand("/bin/prog", None, ["-x", "y"], merged.env)
    assert pickle.loads(pickle.dumps(merged)) == merged
    assert repr(cmd) == (
        "BootstrapCommand(program='/bin/prog', args=['-x', 'y'], env={'A': '1', 'B': '2'})"
    )
    assert "arg0='name'" in repr(BootstrapCommand("p", "name", [], {}))
    assert type(cmd).__module__ == "danaus.actor"


@pytest.mark.parametrize(
    "args",
    [
        ("", None, [], {}),
        (["python"], None, [], {}),
        ("p", 1, [], {}),
        ("p", None, "-m x", {}),
        ("p", None, ["-m", 1], {}),
        ("p", None, [], {"A": 1}),
        ("p", None, [], ["A=1"]),
    ],
)
def test_bootstrap_command_rejects_malformed_parts(args: tuple) -> None:  # type: ignore[type-arg]
    with pytest.raises(TypeError, match=r"program|arg0|args|env"):
        BootstrapCommand(*args)


def test_with_env_rejects_a_malformed_environment() -> None:
    with pytest.raises(TypeError, match="dict of str to str"):
        default_bootstrap_cmd().with_env({"A": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="invalid variable name 'A=B'"):
        default_bootstrap_cmd().with_env({"A=B": "1"})


def test_default_bootstrap_cmd_is_this_python_running_the_proc_entry() -> None:
    cmd = default_bootstrap_cmd()
    assert cmd.program == sys.executable
    assert cmd.args == ["-m", "danaus._runtime.hosting.entry"]
    assert cmd == default_bootstrap_cmd()  # a fresh, equal command each time


# -- what is refused before any proc starts -------------------------------------------


def test_a_missing_program_fails_spawn_procs_naming_the_command() -> None:
    cmd = BootstrapCommand("danaus-no-such-program", None, ["-m", "x"], {})
    with pytest.raises(
        FileNotFoundError, match="'danaus-no-such-program' is not an executable file on PATH"
    ):
        this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=cmd)
    with pytest.raises(FileNotFoundError, match="/nonexistent/python"):
        this_host().spawn_procs(
            bootstrap_command=BootstrapCommand("/nonexistent/python", None, [], {})
        )


def test_spawn_procs_rejects_what_is_not_a_bootstrap_command() -> None:
    with pytest.raises(TypeError, match="BootstrapCommand or a callable"):
        this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=["python", "-m", "x"])
    with pytest.raises(TypeError, match="returned 'python', not a BootstrapCommand"):
        this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=lambda point: "python")


def test_with_python_executable_refuses_a_missing_or_malformed_program() -> None:
    with pytest.raises(FileNotFoundError, match="/nonexistent/python"):
        this_host().with_python_executable("/nonexistent/python").spawn_procs()
    with pytest.raises(TypeError, match="program must be a non-empty str"):
        this_host().with_python_executable(None)  # type: ignore[arg-type]
