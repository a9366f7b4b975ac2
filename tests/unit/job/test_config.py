"""How a job reads its configuration, in this process: Slurm's host lists, saved job
states (JSON data, each field type-checked), context names and torchrun's variables."""

from __future__ import annotations

import json
from typing import Any

import pytest

from danaus._job import paths, statefile
from danaus._job.config import expand_hostlist
from danaus._job.load import job_loads
from danaus._job.spmd import torch_env


def test_slurm_host_lists_expand_like_scontrol_show_hostnames() -> None:
    assert expand_hostlist("n[01-03,07],gpu5") == ["n01", "n02", "n03", "n07", "gpu5"]
    assert expand_hostlist("a[8-10]-ib") == ["a8-ib", "a9-ib", "a10-ib"]
    assert expand_hostlist("single") == ["single"]
    assert expand_hostlist("x[098-101]") == ["x098", "x099", "x100", "x101"]  # width kept
    for bad in ("n[1-", "n[3-1]", "n[a-b]", "a,,b"):
        with pytest.raises(ValueError, match="malformed Slurm host list"):
            expand_hostlist(bad)


def test_a_saved_job_is_json_with_a_format_and_a_version() -> None:
    data = statefile.encode("ProcessJob", {"applied": True, "hosts": ["a", "b"]})
    doc = json.loads(data)
    assert doc == {"format": "danaus-job-state", "version": 1, "kind": "ProcessJob",
                   "job": {"applied": True, "hosts": ["a", "b"]}}  # fmt: skip
    kind, fields = statefile.decode(data, "job.json")
    assert kind == "ProcessJob"
    assert fields.boolean("applied") is True and fields.text_list("hosts") == ["a", "b"]
    with pytest.raises(ValueError, match=r"cannot be represented|Out of range float"):
        statefile.encode("K", {"x": float("nan")})  # not JSON: refused on the way out


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\x80\x04K\x01.", "pickled by an older danaus"),
        (b"{not json", "is not a danaus job state \\(not JSON"),
        (b'{"kind": "X", "job": {}}', 'no "format"'),
        (json.dumps({"format": "danaus-job-state", "version": 2}).encode(), "version 2"),
        (
            json.dumps({"format": "danaus-job-state", "version": 1, "kind": 3}).encode(),
            'needs a "kind" and a "job"',
        ),
    ],
)
def test_what_is_not_a_job_state_is_refused_naming_the_source(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        statefile.decode(data, "'state.json'")
    assert "'state.json'" in str(info.value)


def test_a_field_of_the_wrong_type_is_refused_naming_it_and_the_fix() -> None:
    _, fields = statefile.decode(
        statefile.encode(
            "SSHJob", {"port": "22", "flag": 1, "names": ["a", 2], "n": True, "none": None}
        ),
        "the data",
    )
    with pytest.raises(
        ValueError, match=r"field 'port' must be an integer, got '22'.*job.dump\(\)"
    ):
        fields.integer("port")
    with pytest.raises(ValueError, match="field 'flag' must be"):
        fields.boolean("flag")
    with pytest.raises(ValueError, match="field 'names' must be"):
        fields.text_list("names")
    with pytest.raises(ValueError, match="field 'n' must be"):
        fields.integer("n")  # a bool is no int here
    with pytest.raises(ValueError, match=r"field 'missing' must be .*got '\(missing\)'"):
        fields.text("missing")
    assert fields.opt_text("none") is None and fields.opt_integer("none") is None
    assert not fields.has("missing") and fields.has("none")


def test_loading_a_job_of_a_kind_never_imported_runs_nothing_and_says_what_to_import() -> None:
    data = statefile.encode("evil.module.Job", {})
    with pytest.raises(ValueError, match=r"import evil\.module first"):
        job_loads(data)
    assert "evil" not in __import__("sys").modules


@pytest.mark.parametrize("name", ["default", "a", "exp-1.b_2", "x" * 64])
def test_context_names_that_are_plain_are_accepted(name: str) -> None:
    path = paths.context_state_path(name)
    assert path.endswith("job_state.json")
    assert (path == paths.DEFAULT_JOB_PATH) == (name == "default")
    if name != "default":
        assert f"/{name}/" in path


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a/b", "../up", "x" * 65, 3, None])
def test_context_names_that_could_escape_their_directory_are_refused(name: Any) -> None:
    with pytest.raises(ValueError, match="a context name is 1-64 letters"):
        paths.context_state_path(name)


def test_torch_env_numbers_ranks_row_major_with_the_last_dimension_local() -> None:
    sizes = {"hosts": 2, "gpus": 3}
    env = torch_env({"hosts": 1, "gpus": 2}, sizes)
    assert env == {
        "RANK": "5",
        "LOCAL_RANK": "2",
        "WORLD_SIZE": "6",
        "LOCAL_WORLD_SIZE": "3",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "5",
        "ROLE_WORLD_SIZE": "6",
        "ROLE_NAME": "default",
    }
    three = torch_env({"dc": 1, "hosts": 0, "gpus": 1}, {"dc": 2, "hosts": 2, "gpus": 2})
    assert (three["RANK"], three["GROUP_RANK"], three["GROUP_WORLD_SIZE"]) == ("5", "2", "4")
    with pytest.raises(ValueError, match="at least one dimension"):
        torch_env({}, {})
