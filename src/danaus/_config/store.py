"""``Config``: the settings of one process, defaults < environment < ``configure()``,
under danaus's names and Monarch's."""

from __future__ import annotations

import difflib
import logging
import os
import threading
import warnings
from collections.abc import Mapping
from typing import Any

from .monarch import BY_NAME as _MONARCH
from .monarch import KEPT as _KEPT
from .monarch import MONARCH_OPTIONS
from .monarch.option import NoEffectWarning
from .monarch.values import (
    _alias_in,
    _alias_out,
    _coerce_monarch,
    _monarch_from_text,
    _monarch_to_text,
)
from .parse import _FROM_TEXT, _coerce
from .setting import Setting
from .settings import BY_NAME as _BY_NAME
from .settings import SETTINGS

_reported: set[str] = set()  # cache: the no-effect options warned about in this process
_bad_env_logged: set[str] = set()  # cache: the bad Monarch variables logged
_reported_lock = threading.Lock()


def _unknown(name: str) -> ValueError:
    near = difflib.get_close_matches(name, [*_BY_NAME, *_MONARCH], n=1)
    hint = f" Did you mean {near[0]!r}?" if near else ""
    return ValueError(
        f"{name!r} is not a danaus setting nor one of Monarch's option names (docs/config.md "
        f"lists both).{hint} The settings are: " + ", ".join(sorted(_BY_NAME))
    )


def _report(names: list[str]) -> None:
    """Warn once per process for each no-effect Monarch option that was configured."""
    with _reported_lock:
        fresh = [n for n in names if n not in _reported]
        _reported.update(fresh)
    for name in fresh:
        warnings.warn(
            f"danaus.config: Monarch option {name!r} is kept but has no effect in danaus: "
            f"{_KEPT[name].why}",
            NoEffectWarning,
            stacklevel=4,
        )


class Values:
    """A `Config`'s settings as attributes (``values.spin_wait``), for code that reads
    one on every message: after its first read, a setting is a plain attribute of
    this object (no call at all) until ``configure()`` or ``restore()`` changes the
    settings, which forgets them all."""

    def __init__(self, config: Config) -> None:
        self.__dict__["_Values__config"] = config

    def __getattr__(self, name: str) -> Any:  # only for a setting not read since a change
        config: Config = self.__dict__["_Values__config"]
        setting = _BY_NAME.get(name)
        if setting is None:
            raise AttributeError(str(_unknown(name)))
        with config._lock:  # as configure(): a value read here is never one it replaced
            value = config._cache.get(name, _MISSING)
            if value is _MISSING:
                value = config._cache[name] = config._resolve(setting)
            self.__dict__[name] = value
        return value

    def _forget(self) -> None:
        """Drop every value read (the settings changed; ``Config``'s lock held)."""
        config = self.__dict__["_Values__config"]
        self.__dict__.clear()
        self.__dict__["_Values__config"] = config


_MISSING = object()


class Config:
    """The settings of one process. Read with `get()` (or, where every call counts,
    as attributes of `values`); thread-safe."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ if environ is not None else os.environ
        self._lock = threading.Lock()  # guards _runtime, _cache and values
        self._runtime: dict[str, Any] = {}  # set by configure()
        self._cache: dict[str, Any] = {}  # effective values, filled on first read
        self.values = Values(self)

    def get(self, name: str) -> Any:
        """The effective value of setting ``name`` (fast after the first read)."""
        try:
            return self._cache[name]
        except KeyError:
            pass
        setting = _BY_NAME.get(name)
        if setting is None:
            raise _unknown(name)
        with self._lock:
            value = self._resolve(setting)
            self._cache[name] = value
        return value

    def _resolve(self, setting: Setting) -> Any:
        if setting.name in self._runtime:
            return self._runtime[setting.name]
        raw = self._environ.get(setting.env)
        if raw is None:
            return setting.default
        try:
            return _FROM_TEXT[setting.kind](raw)
        except ValueError as e:
            raise ValueError(f"environment variable {setting.env}={raw!r}: {e}") from None

    def configure(self, **kwargs: Any) -> None:
        checked = {}
        kept = []
        for name, value in kwargs.items():
            setting = _BY_NAME.get(name)
            if setting is not None:
                checked[name] = _coerce(setting, value)
                continue
            opt = _MONARCH.get(name)
            if opt is None:
                raise _unknown(name)
            if opt.setting:  # an alias: store danaus's value under danaus's name
                checked[opt.setting] = _coerce(_BY_NAME[opt.setting], _alias_in(opt, value))
            else:
                checked[name] = _coerce_monarch(opt, value)
                kept.append(name)
        with self._lock:
            self._runtime.update(checked)
            self._cache.clear()
            self.values._forget()
        _report(kept)

    def monarch(self, name: str) -> Any:
        """The value of Monarch option ``name`` as Monarch shows it (``None``: unset)."""
        opt = _MONARCH[name]
        if opt.setting:
            return _alias_out(opt, self.get(opt.setting))
        with self._lock:
            if name in self._runtime:
                return self._runtime[name]
        raw = self._environ.get(opt.env)
        if raw is None:
            return opt.default
        try:
            return _monarch_from_text(opt, raw)
        except (ValueError, TypeError) as e:
            # The option has no effect here: a stray variable must not stop a node.
            if opt.env not in _bad_env_logged:
                _bad_env_logged.add(opt.env)
                logging.getLogger("danaus.config").warning(
                    "ignoring environment variable %s=%r (Monarch option %s, no effect in "
                    "danaus): %s",
                    opt.env,
                    raw,
                    name,
                    e,
                )
            return opt.default

    def runtime(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._runtime)

    def restore(self, runtime: Mapping[str, Any]) -> None:
        with self._lock:
            self._runtime = dict(runtime)
            self._cache.clear()
            self.values._forget()

    def effective(self) -> dict[str, Any]:
        """Every danaus setting, then every Monarch option name that has a value."""
        out = {s.name: self.get(s.name) for s in SETTINGS}
        for opt in MONARCH_OPTIONS:
            if opt.name not in out:
                value = self.monarch(opt.name)
                if value is not None or opt.kind in ("opt_duration", "opt_nonzero"):
                    out[opt.name] = value
        return out

    def env_for_children(self) -> dict[str, str]:
        """``DANAUS_*`` variables that give a child process this process's configured
        values (those set by ``configure()``; the environment is inherited anyway)."""
        out = {}
        for name, value in self.runtime().items():
            if name in _KEPT:
                out[_KEPT[name].env] = _monarch_to_text(_KEPT[name], value)
            else:
                out[_BY_NAME[name].env] = str(int(value) if isinstance(value, bool) else value)
        return out
