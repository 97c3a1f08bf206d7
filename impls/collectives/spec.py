"""An all-reduce algorithm, declared once: `AllReduceAlgorithm` holds what distbench knows
about it (the function, its critical path for the α–β cost model, the lecture's growth
orders). Each algorithm's file declares its spec next to its function;
`impls.collectives.algorithms.ALGORITHMS` lists them, and `all_reduce`, the tuner behind
`algorithm="auto"` and the allreduce_scaling report read the spec, never a list of names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from impls.comm import Communicator
from impls.costmodel.comm import CriticalPath

__all__ = ["ORDER_COLUMNS", "AllReduceAlgorithm"]

ORDER_COLUMNS = ("rounds", "peak", "total")
"""The lecture's table: time in rounds, peak per-node bytes and total bytes, each in O(·)."""


@dataclass(frozen=True, kw_only=True)
class AllReduceAlgorithm:
    """One all-reduce algorithm and what every consumer needs to know about it."""

    name: str
    """The key of `all_reduce(..., algorithm=name)`, configs and results."""
    run: Callable[[torch.Tensor, Communicator, str], None]
    """Runs in place on a flat, contiguous buffer; `op` "avg" leaves a sum (`finish`)."""
    critical_path: CriticalPath
    """(bytes, ranks) -> (messages, bytes) on the busiest rank: what the α–β model prices
    (`impls.costmodel.comm.allreduce_seconds`), and so what `algorithm="auto"` predicts."""
    orders: Mapping[str, str] | None
    """The lecture's O(·) for each of `ORDER_COLUMNS` it states ("O(N)", "O(log N)", …);
    None when the lecture does not list the algorithm."""
