"""Monarch's options that danaus keeps or refuses by name, checked where they are given:
``@endpoint(propagate=, instrument=)``, ``attach_to_workers(name=, private_key=)`` and
``proc_mesh(env=)``. Endpoints with these options called on procs, and what
``attach_to_workers`` and ``enable_transport`` do in a client:
``tests/integration/test_compat_options.py``."""

from __future__ import annotations

import pytest

from danaus.actor import Actor, attach_to_workers, endpoint, proc_mesh


def _fake_outputs(x: object) -> object:
    return x


class Options(Actor):
    @endpoint(propagate="inspect", instrument=False)
    def inspected(self, x: int) -> int:
        return x + 1

    @endpoint(propagate=_fake_outputs)
    def mocked(self, x: int) -> int:
        return x * 2


def test_propagate_and_instrument_are_kept_on_the_endpoint_for_the_tensor_engine() -> None:
    assert Options.inspected.propagate == "inspect"  # type: ignore[attr-defined]
    assert Options.inspected.instrument is False  # type: ignore[attr-defined]
    assert Options.mocked.propagate is _fake_outputs  # type: ignore[attr-defined]
    assert Options.mocked.instrument is True  # type: ignore[attr-defined]


def test_an_unknown_propagate_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"propagate='guess'.*'cached', 'inspect', 'mocked'"):

        @endpoint(propagate="guess")  # type: ignore[call-overload]
        def f(self: object) -> None: ...


def test_an_instrument_that_is_not_a_bool_is_refused_naming_it() -> None:
    with pytest.raises(TypeError, match="instrument='yes'"):

        @endpoint(instrument="yes")  # type: ignore[call-overload]
        def f(self: object) -> None: ...


def test_attach_to_workers_refuses_a_private_key_naming_it_and_the_way_instead() -> None:
    with pytest.raises(NotImplementedError, match=r"private_key='key.pem'.*DANAUS_TLS_KEY"):
        attach_to_workers(workers=["tcp://127.0.0.1:9"], private_key="key.pem")


def test_attach_to_workers_refuses_a_name_that_is_not_a_string() -> None:
    with pytest.raises(TypeError, match="name must be a str or None, got 3"):
        attach_to_workers(workers=["tcp://127.0.0.1:9"], name=3)  # type: ignore[arg-type]


def test_proc_mesh_refuses_env_as_monarch_does() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=r"env=.*bootstrap"):
        proc_mesh(gpus=1, env={"A": "1"})
