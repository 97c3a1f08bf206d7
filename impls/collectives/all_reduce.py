"""All-reduce, dispatching to one of the lecture's algorithms by name.

| algorithm         | rounds            | bytes sent by the busiest rank | total bytes |
|-------------------|-------------------|--------------------------------|-------------|
| parameter_server  | 2                 | (N−1)·M  (the server)          | 2(N−1)·M    |
| sequential        | 2(N−1)            | (N−1)·M  (the server)          | 2(N−1)·M    |
| ring              | 2(N−1)            | 2(N−1)/N·M                     | 2(N−1)·M    |
| parallel          | 1                 | (N−1)·M                        | N(N−1)·M    |
| recursive_halving | 2·log2 N (+2)     | 2(N−1)/N·M                     | 2(N−1)·M    |
| tree              | 2·⌈log2 N⌉        | ⌈log2 N⌉·M  (the root)         | 2(N−1)·M    |
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from impls.collectives.central import parameter_server_all_reduce, sequential_all_reduce
from impls.collectives.parallel import parallel_all_reduce
from impls.collectives.partition import flat_view
from impls.collectives.recursive_halving import recursive_halving_all_reduce
from impls.collectives.reduce_ops import check_op, finish
from impls.collectives.ring import ring_all_reduce
from impls.collectives.tree import tree_all_reduce
from impls.comm import Communicator

__all__ = ["ALGORITHMS", "all_reduce", "check_algorithm"]

ALGORITHMS: dict[str, Callable[[torch.Tensor, Communicator, str], None]] = {
    "parameter_server": parameter_server_all_reduce,
    "sequential": sequential_all_reduce,
    "ring": ring_all_reduce,
    "parallel": parallel_all_reduce,
    "recursive_halving": recursive_halving_all_reduce,
    "tree": tree_all_reduce,
}


def check_algorithm(algorithm: str) -> str:
    if algorithm not in ALGORITHMS:
        allowed = ", ".join(ALGORITHMS)
        raise ValueError(f"algorithm={algorithm!r} is unknown; allowed values: {allowed}")
    return algorithm


def all_reduce(
    tensor: torch.Tensor,
    comm: Communicator,
    *,
    op: str = "sum",
    algorithm: str = "ring",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce `tensor` over all ranks; in place, or into `out` leaving `tensor` intact."""
    check_op(op)
    run = ALGORITHMS[check_algorithm(algorithm)]
    comm.count_call("all_reduce")
    target = tensor
    if out is not None:
        if out.shape != tensor.shape or out.dtype != tensor.dtype:
            raise ValueError("out must have the shape and dtype of tensor")
        out.copy_(tensor)
        target = out
    work = target if target.is_contiguous() else target.contiguous()
    run(flat_view(work), comm, op)
    finish(work, op, comm.world_size)
    if work is not target:
        target.copy_(work)
    return target
