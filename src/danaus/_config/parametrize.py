"""Monarch's pytest decorators that run a test under several settings."""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable
from typing import Any

from .process import configured


def _parametrized(
    config_dicts: list[dict[str, Any]], param_ids: list[str]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    import pytest  # only the tests that use these decorators need pytest

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        orig_sig = inspect.signature(fn)
        first = inspect.Parameter("_config_overrides", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        new_sig = orig_sig.replace(parameters=[first, *orig_sig.parameters.values()])
        wrapped: Callable[..., Any]
        if inspect.iscoroutinefunction(fn):

            async def async_wrapper(
                _config_overrides: dict[str, Any], *args: Any, **kwargs: Any
            ) -> Any:
                with configured(**_config_overrides):
                    return await fn(*args, **kwargs)

            wrapped = async_wrapper
        else:

            def sync_wrapper(_config_overrides: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
                with configured(**_config_overrides):
                    return fn(*args, **kwargs)

            wrapped = sync_wrapper
        functools.update_wrapper(wrapped, fn)
        setattr(wrapped, "__signature__", new_sig)  # noqa: B010 - mypy: no such attribute
        marked: Callable[..., Any] = pytest.mark.parametrize(
            "_config_overrides", config_dicts, ids=param_ids
        )(wrapped)
        return marked

    return decorator


def parametrize_config(**config_options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A pytest decorator running the test once per combination (cartesian product) of
    the given values, each inside ``configured(...)`` with them, as Monarch's:

        @parametrize_config(prefix_with_rank={True, False}, tail_log_lines={0, 10})
        def test_x(): ...  # 4 runs

    Raises `ValueError` without options."""
    if not config_options:
        raise ValueError("parametrize_config requires at least one config option")
    keys = list(config_options)
    combos = list(itertools.product(*(list(config_options[k]) for k in keys)))
    return _parametrized(
        [dict(zip(keys, c, strict=True)) for c in combos],
        ["-".join(f"{k}={v}" for k, v in zip(keys, c, strict=True)) for c in combos],
    )


def parametrize_config_pointwise(
    **config_options: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Like [`parametrize_config()`][danaus.config.parametrize_config], but the value sequences are
    taken in lockstep
    (``zip``): one run per position. Raises `ValueError` without options or if
    the sequences' lengths differ."""
    if not config_options:
        raise ValueError("parametrize_config_pointwise requires at least one config option")
    keys = list(config_options)
    values = [list(config_options[k]) for k in keys]
    if len({len(v) for v in values}) != 1:
        lengths = {k: len(v) for k, v in zip(keys, values, strict=True)}
        raise ValueError(
            "parametrize_config_pointwise requires every option to have the same number "
            f"of values; got lengths {lengths}"
        )
    combos = list(zip(*values, strict=True))
    return _parametrized(
        [dict(zip(keys, c, strict=True)) for c in combos],
        ["-".join(f"{k}={v}" for k, v in zip(keys, c, strict=True)) for c in combos],
    )
