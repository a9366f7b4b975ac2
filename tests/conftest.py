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


def cuda_missing() -> str | None:
    """Why the ``gpu`` tests cannot run here (None: CUDA is usable)."""
    try:
        import torch
    except ImportError:
        return "needs CUDA: torch is not installed"
    if not torch.cuda.is_available():
        return f"needs CUDA: torch {torch.__version__} sees no GPU (torch.cuda.is_available())"
    return None


@pytest.fixture
def need_gpus() -> Callable[[int], int]:
    """``need_gpus(n)`` skips the test (saying why) unless this machine shows ``n`` GPUs;
    returns how many it shows."""

    def need(n: int) -> int:
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < n:
            pytest.skip(f"needs {n} GPUs; this machine shows {have}")
        return have

    return need


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests, saying why, without CUDA; leave ``slow`` and ``soak`` tests out
    unless a ``-m`` expression is given (``-m slow``, ``-m soak`` runs them)."""
    gpu = [i for i in items if i.get_closest_marker("gpu")]
    why = cuda_missing() if gpu else None
    if why is not None:
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason=why))
    if config.getoption("markexpr"):
        return
    slow = [i for i in items if i.get_closest_marker("slow") or i.get_closest_marker("soak")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i not in slow]


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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How many of the docs' Python blocks ran and which were skipped (and why)."""
    import sys

    module = sys.modules.get("test_doc_blocks")
    if module is not None and module.RESULTS:
        from docrunner import summary

        terminalreporter.write_line(summary(module.RESULTS))
