"""The from-scratch all-reduce algorithms by name, in the order reports list them.

A module of its own so that both `all_reduce` (which dispatches on the name) and the
`tuner` (which times each one to choose among them) can import it without importing each
other.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from impls.collectives.central import parameter_server_all_reduce, sequential_all_reduce
from impls.collectives.parallel import parallel_all_reduce
from impls.collectives.recursive_halving import recursive_halving_all_reduce
from impls.collectives.ring import ring_all_reduce
from impls.collectives.tree import tree_all_reduce
from impls.comm import Communicator

__all__ = ["ALGORITHMS"]

# Each runs in place on a flat, contiguous buffer; `op` "avg" leaves a sum (see `finish`).
ALGORITHMS: dict[str, Callable[[torch.Tensor, Communicator, str], None]] = {
    "parameter_server": parameter_server_all_reduce,
    "sequential": sequential_all_reduce,
    "ring": ring_all_reduce,
    "parallel": parallel_all_reduce,
    "recursive_halving": recursive_halving_all_reduce,
    "tree": tree_all_reduce,
}
