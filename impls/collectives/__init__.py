"""Collectives built only on `impls.comm` point-to-point messages (never torch's own)."""

from impls.collectives.all_reduce import (
    ALGORITHM_CHOICES,
    ALGORITHMS,
    all_reduce,
    check_algorithm,
)
from impls.collectives.primitives import (
    all_gather,
    all_to_all,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from impls.collectives.reduce_ops import REDUCE_OPS, check_op
from impls.collectives.tuner import AllReduceTuner

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_CHOICES",
    "AllReduceTuner",
    "REDUCE_OPS",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "check_algorithm",
    "check_op",
    "gather",
    "reduce",
    "reduce_scatter",
    "scatter",
]
