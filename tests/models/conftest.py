"""Model tests run single-threaded: their tensors are tiny, and on a shared 2-core host
torch's intra-op threads contend with other processes (a 50x slowdown measured here)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_intra_op_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
