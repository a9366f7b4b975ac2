"""A saved job (``JobTrait.dump``) on disk: a JSON document that reading cannot turn into code.

A job's state is data (the scheduler's job id, hosts, worker addresses and
pids, the job secret), so it is saved as JSON with a schema version, never
pickled:

    {"format": "danaus-job-state", "version": 1, "kind": "ProcessJob",
     "job": {"applied": true, "hosts": {...}, "workers": {...}, ...}}

``kind`` names the job class (``JobTrait._kind()``) and ``job`` holds the
fields that class saves (``_to_doc``) and reads back, each type-checked
(``_from_doc`` through `Fields`). A file is read only if it is the
user's own private file in a directory no one else can write
(``_transport.owned``): a state file is trusted with the job secret and
decides which workers the client talks to. A job state pickled by an older
danaus is refused with a message saying what to do; the default file's name
changed with the format (``.danaus/job_state.json``), so an old
``job_state.pkl`` beside it is never read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from .._transport.owned import read_owned, write_private

__all__ = ["FORMAT", "VERSION", "Fields", "decode", "encode", "read", "write"]

FORMAT = "danaus-job-state"
VERSION = 1
WHAT = "the job state file"

T = TypeVar("T")


class Fields:
    """The ``job`` object of a saved job, read one typed field at a time: a missing or
    mistyped field raises ``ValueError`` naming it, the kind and the source."""

    def __init__(self, doc: Mapping[str, Any], kind: str, source: str) -> None:
        self._doc = doc
        self.kind = kind
        self.source = source

    def _bad(self, key: str, want: str) -> ValueError:
        got = self._doc.get(key, "(missing)")
        return ValueError(
            f"{self.source} is not a valid {self.kind} job state: field {key!r} must be "
            f"{want}, got {got!r}. Save the job again with this danaus (job.dump())"
        )

    def has(self, key: str) -> bool:
        return key in self._doc

    def get(self, key: str, check: Callable[[Any], bool], want: str) -> Any:
        if key not in self._doc or not check(self._doc[key]):
            raise self._bad(key, want)
        return self._doc[key]

    def text(self, key: str) -> str:
        return str(self.get(key, _is_str, "a string"))

    def opt_text(self, key: str) -> str | None:
        value = self.get(key, lambda v: v is None or _is_str(v), "a string or null")
        return None if value is None else str(value)

    def integer(self, key: str) -> int:
        return int(self.get(key, _is_int, "an integer"))

    def opt_integer(self, key: str) -> int | None:
        value = self.get(key, lambda v: v is None or _is_int(v), "an integer or null")
        return None if value is None else int(value)

    def opt_number(self, key: str) -> float | int | None:
        return self.get(  # type: ignore[no-any-return]
            key, lambda v: v is None or _is_int(v) or isinstance(v, float), "a number or null"
        )

    def boolean(self, key: str) -> bool:
        return bool(self.get(key, lambda v: isinstance(v, bool), "true or false"))

    def text_list(self, key: str) -> list[str]:
        return list(self.get(key, _is_str_list, "a list of strings"))

    def opt_text_list(self, key: str) -> list[str] | None:
        value = self.get(key, lambda v: v is None or _is_str_list(v), "a list of strings or null")
        return None if value is None else list(value)

    def mapping(self, key: str, value: Callable[[Any], T], want: str) -> dict[str, T]:
        """A JSON object whose values ``value`` converts (raising ``ValueError``/
        ``TypeError``/``KeyError`` on a bad one)."""
        raw = self.get(key, lambda v: isinstance(v, dict), f"an object of {want}")
        try:
            return {str(k): value(v) for k, v in raw.items()}
        except (ValueError, TypeError, KeyError):
            raise self._bad(key, f"an object of {want}") from None


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def checked(value: Any, check: Callable[[Any], bool]) -> Any:
    """``value`` if ``check`` holds, else ``ValueError`` (for ``Fields.mapping``'s converters)."""
    if not check(value):
        raise ValueError(value)
    return value


def encode(kind: str, job: Mapping[str, Any]) -> bytes:
    """The document of a job of ``kind`` whose fields are ``job`` (JSON values only)."""
    doc = {"format": FORMAT, "version": VERSION, "kind": kind, "job": dict(job)}
    return (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode()


def decode(data: bytes, source: str = "the data") -> tuple[str, Fields]:
    """``(kind, fields)`` of a saved job; ``ValueError`` naming ``source`` if it is not one."""
    if data[:1] == b"\x80":  # a pickle's PROTO opcode: a job an older danaus saved
        raise ValueError(
            f"{source} is a job state pickled by an older danaus; this one reads job states "
            "only as JSON data, since loading a pickle runs whatever code it names. Kill that "
            "job with the danaus that saved it (`danaus kill --state FILE`), or remove the "
            "file, and apply the job again"
        )
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{source} is not a danaus job state (not JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(
            f'{source} is not a danaus job state (no "format": {FORMAT!r}); '
            "save jobs with job.dump(path) or dumps()"
        )
    version = doc.get("version")
    if version != VERSION:
        raise ValueError(
            f"{source} is a job state of version {version!r}; this danaus reads version "
            f"{VERSION}. Use the danaus that saved it, or apply the job again"
        )
    kind, job = doc.get("kind"), doc.get("job")
    if not isinstance(kind, str) or not isinstance(job, dict):
        raise ValueError(f'{source} is not a valid job state: it needs a "kind" and a "job"')
    return kind, Fields(job, kind, source)


def read(path: str) -> bytes:
    """The saved job at ``path``, refused (``ValueError`` naming the fix) unless it is this
    user's own private file in a directory only this user can write."""
    return read_owned(path, WHAT, private_dir=True)


def write(path: str, data: bytes) -> None:
    """Save ``data`` at ``path`` privately and at once (see ``owned.write_private``)."""
    write_private(path, data, WHAT)
