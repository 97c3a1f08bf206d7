"""Shared fixtures. Multi-process tests run on one pool of gloo ranks per session
(`ranks8`): starting ranks costs seconds on two cores, so every test reuses it, and each
test picks the world size it needs as a sub-group of the first k ranks."""

from __future__ import annotations

import pytest

from bench.launch import RankPool


@pytest.fixture(scope="session")
def ranks8():
    """Eight gloo ranks with a hard per-call timeout; a failure names each rank's error."""
    with RankPool(8, timeout_s=180.0) as pool:
        yield pool
