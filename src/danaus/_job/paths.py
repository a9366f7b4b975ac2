"""Where job states live: the ``.danaus`` directory, its contexts, the current one.

A *context* is a named slot for one running job (``current.py`` has the commands)::

    .danaus/job_state.json                the "default" context's job (DEFAULT_JOB_PATH)
    .danaus/contexts/NAME/job_state.json  another context's job
    .danaus/context                       the active context's name (absent: "default")

Only paths and the small files naming them: nothing here loads a job, so ``jobs.py``
can find its default path without importing what loads jobs.
"""

from __future__ import annotations

import os

from .. import _config as config
from .._transport.owned import ensure_private_dir, read_owned

__all__ = [
    "DANAUS_DIR",
    "DEFAULT_CONTEXT",
    "DEFAULT_JOB_PATH",
    "context_state_path",
    "current_context",
    "current_job_path",
]

DANAUS_DIR = ".danaus"
#: Where a job is saved unless a context or the setting ``job_state_path`` says otherwise
#: (Monarch's is ``.monarch/job_state.pkl``, a pickle; danaus's is JSON data).
DEFAULT_JOB_PATH = f"{DANAUS_DIR}/job_state.json"
DEFAULT_CONTEXT = "default"
_CONTEXT_FILE = f"{DANAUS_DIR}/context"
_CONTEXTS = f"{DANAUS_DIR}/contexts"


def _check_name(name: object) -> str:
    ok = (
        isinstance(name, str)
        and 0 < len(name) <= 64
        and name[0] not in ".-"
        and all(c.isalnum() or c in "._-" for c in name)
    )
    if not ok:
        raise ValueError(
            f"a context name is 1-64 letters, digits, '.', '_' or '-', not starting with '.' "
            f"or '-'; got {name!r}"
        )
    return name  # type: ignore[return-value]


def context_state_path(name: str) -> str:
    """Where context ``name`` keeps its job state."""
    if _check_name(name) == DEFAULT_CONTEXT:
        return DEFAULT_JOB_PATH
    return f"{_CONTEXTS}/{name}/job_state.json"


def _spec_path(name: str) -> str:
    return f"{_CONTEXTS}/{_check_name(name)}/spec"


def _make_context_dir(name: str) -> None:
    """``.danaus/contexts/NAME``, each level created mode 700 if missing (or checked)."""
    for directory in (DANAUS_DIR, _CONTEXTS, f"{_CONTEXTS}/{_check_name(name)}"):
        ensure_private_dir(directory, "the context directory")


def _read_text(path: str, what: str) -> str | None:
    """The file's text, ``None`` if there is none (then its directory is not checked: the
    job state read next says what is wrong with it)."""
    if not os.path.lexists(path):
        return None
    try:
        return read_owned(path, what, private_dir=True).decode().strip()
    except FileNotFoundError:
        return None


def current_context() -> str:
    """The active context's name (``"default"`` until ``context_use`` chose another)."""
    name = _read_text(_CONTEXT_FILE, "the current context file")
    if not name:
        return DEFAULT_CONTEXT
    try:
        return _check_name(name)
    except ValueError as e:
        raise ValueError(f"{_CONTEXT_FILE} names no valid context ({e}); remove it") from None


def current_job_path() -> str:
    """Where the current job is saved: the setting ``job_state_path`` if it was changed,
    else the active context's job state (``DEFAULT_JOB_PATH`` for ``"default"``)."""
    setting = str(config.get("job_state_path"))
    if setting != DEFAULT_JOB_PATH:
        return setting
    return context_state_path(current_context())
