"""The current job and its contexts: Monarch's ``set_current_job``/``load_current_job`` and
``monarch context create/use/rm/ls``, on danaus's JSON job states.

A *context* is a named slot for one running job, so that several jobs can be
driven from one directory (``danaus context use eval`` then ``danaus exec``)::

    .danaus/job_state.json                the "default" context's job (DEFAULT_JOB_PATH)
    .danaus/contexts/default/spec         its job's spec: "myjob.job" or "myjob.py:job"
    .danaus/contexts/NAME/job_state.json  another context's job
    .danaus/contexts/NAME/spec
    .danaus/context                       the active context's name (absent: "default")

Monarch points ``.monarch/job_state.pkl`` at the active context's state with a
symbolic link; danaus never reads a job state through a link (whoever could
change it would choose the workers a client trusts), so the active context is
named in a file instead, and ``JobTrait.state()``'s default path follows it while
the setting ``job_state_path`` keeps its default. Every one of these files is
read only if it is the user's own private file in a directory no one else can
write (``_transport.owned``): a spec names code to import.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import sys

from .._transport.owned import write_private
from .jobs import JobTrait
from .load import job_load
from .paths import (
    _CONTEXT_FILE,
    _CONTEXTS,
    DANAUS_DIR,
    DEFAULT_CONTEXT,
    DEFAULT_JOB_PATH,
    _check_name,
    _make_context_dir,
    _read_text,
    _spec_path,
    context_state_path,
    current_context,
    current_job_path,
)

__all__ = [
    "DANAUS_DIR",
    "DEFAULT_CONTEXT",
    "DEFAULT_JOB_PATH",
    "context_create",
    "context_names",
    "context_rm",
    "context_state_path",
    "context_use",
    "current_context",
    "current_job_path",
    "import_job",
    "load_current_job",
    "set_current_job",
]


def import_job(spec: str) -> JobTrait:
    """The job object ``spec`` names: ``MODULE.NAME`` (imported from the current directory
    too, as Monarch's command line does) or danaus's ``FILE.py:NAME``."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a job spec is MODULE.NAME or FILE.py:NAME, got {spec!r}")
    if ":" in spec:
        path, _, name = spec.rpartition(":")
        if not os.path.isfile(path):
            raise ValueError(f"{path!r} is not a file (JOB is FILE.py:NAME or MODULE.NAME)")
        module_spec = importlib.util.spec_from_file_location("_danaus_jobfile", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        modname, _, name = spec.rpartition(".")
        if not modname:
            raise ValueError(f"JOB must be FILE.py:NAME or MODULE.NAME, got {spec!r}")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(modname)
    job = getattr(module, name, None)
    if not isinstance(job, JobTrait):
        raise ValueError(f"{spec} is {type(job).__name__}, not a danaus job")
    return job


def set_current_job(module_path: str) -> None:
    """Record ``module_path`` (``"myjob.job"``, or danaus's ``"myjob.py:job"``) as the active
    context's job spec, for ``load_current_job()`` and ``danaus apply`` without a JOB."""
    if (
        not isinstance(module_path, str)
        or not module_path.strip()
        or ("." not in module_path and ":" not in module_path)
    ):
        raise ValueError(
            f"module_path must be 'module.attr' (or 'FILE.py:attr'), got {module_path!r}"
        )
    name = current_context()
    _make_context_dir(name)
    write_private(_spec_path(name), (module_path.strip() + "\n").encode(), "the job spec file")


def load_current_job() -> JobTrait:
    """A fresh job object made from the active context's spec (not yet applied or attached:
    its ``state()`` reuses the context's running job if that ``can_run`` it).

    ``FileNotFoundError`` if the context has no spec yet.
    """
    name = current_context()
    spec = _read_text(_spec_path(name), "the job spec file")
    if not spec:
        raise FileNotFoundError(
            f"no job spec in context {name!r} ({_spec_path(name)}): run `danaus apply JOB` first"
        )
    return import_job(spec)


def context_names() -> list[str]:
    """Every context: ``"default"`` and those created, sorted."""
    names = {DEFAULT_CONTEXT}
    if os.path.isdir(_CONTEXTS):
        names |= {d.name for d in os.scandir(_CONTEXTS) if d.is_dir(follow_symlinks=False)}
    return sorted(names)


def context_create(name: str) -> None:
    """Create context ``name`` (a no-op if it exists); the active one does not change."""
    _make_context_dir(name)


def context_use(name: str) -> None:
    """Make ``name`` the active context (created if missing)."""
    context_create(name)
    if name == DEFAULT_CONTEXT:
        with contextlib.suppress(FileNotFoundError):
            os.remove(_CONTEXT_FILE)
    else:
        write_private(_CONTEXT_FILE, (name + "\n").encode(), "the current context file")


def context_rm(name: str) -> str | None:
    """Remove context ``name``, killing its job first if one is saved there; the active
    context becomes ``"default"`` if it was ``name``. The error that kept the job from
    being killed, or ``None`` (the context is removed either way, as in Monarch)."""
    _check_name(name)
    state = context_state_path(name)
    error = None
    if os.path.exists(state):
        try:
            job = job_load(state)
            job._cached_path = state
            job.kill()
        except Exception as e:  # reported to the caller; the context goes regardless
            error = f"{type(e).__name__}: {e}"
        if os.path.exists(state):
            os.remove(state)
    shutil.rmtree(f"{_CONTEXTS}/{name}", ignore_errors=True)
    if name != DEFAULT_CONTEXT and current_context() == name:
        os.remove(_CONTEXT_FILE)
    return error
