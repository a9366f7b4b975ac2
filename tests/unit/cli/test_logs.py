"""``danaus logs``' reading of a proc's log file, without a proc: the last lines of a
file larger than one read block, and each line prefixed once."""

from __future__ import annotations

import io
from pathlib import Path

from danaus._cli.logs import _emit, _last_lines


def test_the_last_lines_of_a_file_are_found_across_read_blocks(tmp_path: Path) -> None:
    path = tmp_path / "p.log"
    lines = [f"line {i:06d} " + "x" * 90 for i in range(3000)]  # about 300 KiB: 5 blocks
    path.write_text("".join(f"{line}\n" for line in lines))
    data, end = _last_lines(str(path), 1000)
    assert end == path.stat().st_size  # where following the file goes on from
    assert data.decode().splitlines() == lines[-1000:]
    assert _last_lines(str(path), 0)[0] == b""
    short, _ = _last_lines(str(path), 10**6)  # more than the file has: all of it
    assert short.decode().splitlines() == lines


def test_a_last_line_without_its_newline_is_kept_and_given_one(tmp_path: Path) -> None:
    path = tmp_path / "p.log"
    path.write_bytes(b"a\nb\npartial")
    assert _last_lines(str(path), 2) == (b"b\npartial\n", 11)


def test_each_line_is_prefixed_once_and_bad_utf8_does_not_stop_the_output() -> None:
    out = io.StringIO()
    _emit(out, "[p0 {gpus=1}]", b"one\ntwo\n\xff\n")
    assert out.getvalue() == "[p0 {gpus=1}] one\n[p0 {gpus=1}] two\n[p0 {gpus=1}] \ufffd\n"
    _emit(out, "[x]", b"")
    assert out.getvalue().count("\n") == 3
