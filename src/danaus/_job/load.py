"""``job_load`` / ``job_loads``: a saved job back as a job object of its kind.

The document names its kind (``JobTrait._kind()``); the kind is looked up among
the job classes this process has imported (danaus's own are imported here),
never imported by name from the document, so loading a job state runs no code
it names. See ``statefile`` for the format and the checks on the file.
"""

from __future__ import annotations

from . import statefile
from .jobs import JobTrait
from .slurm import SlurmJob
from .workers import ProcessJob, SSHJob

__all__ = ["job_load", "job_loads"]

BUILTIN = (
    ProcessJob,
    SSHJob,
    SlurmJob,
)  # imported for their kinds (LocalJob lives beside JobTrait)


def _job_classes(cls: type[JobTrait]) -> list[type[JobTrait]]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_job_classes(sub)]
    return out


def _class_of(kind: str, source: str) -> type[JobTrait]:
    found = {c for c in _job_classes(JobTrait) if c._kind() == kind}
    if len(found) == 1:
        return found.pop()
    if found:
        names = sorted(f"{c.__module__}.{c.__qualname__}" for c in found)
        raise ValueError(
            f"{source} holds a job of kind {kind!r}, which several classes claim ({names}); "
            "give each its own _KIND"
        )
    module = kind.rpartition(".")[0]
    hint = f"import {module} first" if module else "import the module that defines it first"
    raise ValueError(
        f"{source} holds a job of kind {kind!r}, a class this process has not imported: "
        f"{hint} (danaus never imports what a job state names)"
    )


def job_loads(data: bytes) -> JobTrait:
    """The job saved by ``JobTrait.dumps``: a JSON document, so loading it runs no code.

    ``ValueError`` if ``data`` is not a job state (a job state pickled by an older
    danaus is refused, saying what to do), names a kind this process has not
    imported, or holds a field of the wrong type.

    Example:

        again = job_loads(job.dumps())
        assert again.can_run(job)
    """
    return _decode(data, "the data")


def job_load(filename: str) -> JobTrait:
    """The job saved by ``JobTrait.dump(filename)``.

    The file must be this user's own, readable by no one else (mode 600), in a
    directory no one else can write, or ``ValueError`` says which and how to fix it:
    whoever can change a job state chooses the workers (and so the code) this
    client trusts. ``FileNotFoundError`` if there is no such file.
    """
    return _decode(statefile.read(filename), repr(filename))


def _decode(data: bytes, source: str) -> JobTrait:
    kind, fields = statefile.decode(data, source)
    return _class_of(kind, source)._restore(fields)
