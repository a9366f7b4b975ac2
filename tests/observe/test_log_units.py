"""The pure parts of logs: prefixes, coordinates, aggregation (no processes)."""

from __future__ import annotations

from typing import Any

import pytest

from danaus._runtime.logs import dirs as logdir
from danaus._runtime.logs.client import Printer
from danaus._wire.protocol import Log


def test_prefixes_name_the_mesh_and_its_coordinates() -> None:
    assert logdir.format_prefix("trainer", "hosts=1,gpus=3") == "[trainer {hosts=1,gpus=3}]"
    assert logdir.format_prefix("solo", "") == "[solo]"


def test_coordinates_parse_and_bad_ones_are_named() -> None:
    assert logdir.parse_coords("hosts=1, gpus=3") == {"hosts": 1, "gpus": 3}
    assert logdir.parse_coords("{gpus=0}") == {"gpus": 0}
    assert logdir.parse_coords("") == {}
    with pytest.raises(ValueError, match="bad coordinate 'gpus' in 'gpus'"):
        logdir.parse_coords("gpus")
    with pytest.raises(ValueError, match="bad coordinate 'gpus=x'"):
        logdir.parse_coords("gpus=x")


def _printer() -> Any:
    return Printer(None)  # type: ignore[arg-type]  # no runtime: nothing is acknowledged


def test_aggregation_groups_lines_equal_but_for_numbers_in_order_of_first_sight(
    capsys: pytest.CaptureFixture[str],
) -> None:
    p = _printer()
    for gpu in range(3):
        body = b"".join(b"step %d loss 0.%d\n" % (i, gpu) for i in range(4)) + b"ready\n"
        p._on_log(None, Log(f"p{gpu}", "trainer", f"gpus={gpu}", 1, 0), body)
    p._on_log(None, Log("p0", "trainer", "gpus=0", 2, 0), b"warning: disk 91% full\n")
    p._on_log(None, Log("p9", "other", "gpus=0", 1, 0), b"step 1 loss 0.5\n")
    assert capsys.readouterr().out == ""  # held for the window
    p._print_groups()
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "[12 similar lines] [trainer {gpus=0}] step 0 loss 0.0",
        "[3 similar lines] [trainer {gpus=0}] ready",
        "[other {gpus=0}] step 1 loss 0.5",  # another mesh: not merged
    ]
    assert err == "[trainer {gpus=0}] warning: disk 91% full\n"
    assert p.statistics().lines == 17
    assert p.tail("p1") == [
        "step 0 loss 0.1",
        "step 1 loss 0.1",
        "step 2 loss 0.1",
        "step 3 loss 0.1",
        "ready",
    ]


def test_without_a_window_lines_print_at_once_and_drops_are_announced(
    capsys: pytest.CaptureFixture[str],
) -> None:
    p = _printer()
    p.set_window(["p0"], None)
    p._on_log(None, Log("p0", "m", "gpus=0", 1, 0), b"a\nb\n")
    p._on_log(None, Log("p0", "m", "gpus=0", 1, 7), b"c\n")
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "[m {gpus=0}] a",
        "[m {gpus=0}] b",
        "[m {gpus=0}] [7 lines of stdout dropped: the client did not keep up; the log file "
        "on the host has them all]",
        "[m {gpus=0}] c",
    ]
    st = p.statistics("p0")
    assert (st.lines, st.dropped) == (3, 7)
