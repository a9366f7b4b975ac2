"""Names of ``danaus.rdma`` that older Monarch programs import (moved from
tests/integration/test_compat_options.py: nothing here needs a process)."""

from __future__ import annotations

import warnings

import pytest


def test_rdma_names_of_older_programs_exist() -> None:
    from danaus.rdma import (
        RDMAReadTransferWarning,
        RDMAWriteTransferWarning,
        gpu_direct_rdma_supported,
    )

    assert gpu_direct_rdma_supported() is False
    for category in (RDMAReadTransferWarning, RDMAWriteTransferWarning):
        assert issubclass(category, Warning)
        with warnings.catch_warnings():
            warnings.simplefilter("error", category)
            with pytest.raises(category):
                warnings.warn("a transfer", category, stacklevel=1)
