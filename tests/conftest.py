"""Fixtures shared by every suite."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import danaus.config


@pytest.fixture
def settings() -> Iterator[Callable[..., None]]:
    """``settings(name=value, ...)`` configures danaus for one test; restored after it."""
    saved = danaus.config.get_runtime_config()
    yield danaus.config.configure
    danaus.config.clear_runtime_config()
    danaus.config.configure(**saved)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave ``slow`` tests out unless a ``-m`` expression is given (``-m slow`` runs them)."""
    if config.getoption("markexpr"):
        return
    slow = [i for i in items if i.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i.get_closest_marker("slow") is None]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A throwaway CA and one certificate it signed, as danaus's TLS settings
    (``tls_cert``, ``tls_key``, ``tls_ca``: PEM files)."""
    if shutil.which("openssl") is None:
        pytest.fail("the TLS tests need the openssl tool (Debian: apt-get install openssl)")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "1", "-subj", "/CN=danaus-test-ca", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key",
             "-out", "node.csr", "-subj", "/CN=node", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "node.pem", "-days", "1", cwd=d)  # fmt: skip
    return {
        "tls_cert": str(d / "node.pem"),
        "tls_key": str(d / "node.key"),
        "tls_ca": str(d / "ca.pem"),
    }
