"""Benchmarks share one pool of 4 gloo ranks (the issue's N=4 reference point)."""

from __future__ import annotations

import pytest

from bench.launch import RankPool


@pytest.fixture(scope="session")
def ranks4():
    with RankPool(4, timeout_s=600.0) as pool:
        yield pool
