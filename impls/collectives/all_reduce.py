"""All-reduce, dispatching to one of the lecture's algorithms by name, or to the one a
tuner predicts fastest (`algorithm="auto"`, see `impls.collectives.tuner`).

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

import torch

from impls.collectives.algorithms import ALGORITHMS
from impls.collectives.partition import flat_view
from impls.collectives.reduce_ops import check_op, finish
from impls.collectives.tuner import AllReduceTuner, default_link
from impls.comm import Communicator

__all__ = ["ALGORITHMS", "ALGORITHM_CHOICES", "AUTO", "all_reduce", "check_algorithm"]

AUTO = "auto"
ALGORITHM_CHOICES = (*ALGORITHMS, AUTO)
"""What `algorithm=` accepts: every from-scratch algorithm, and `auto`."""


def check_algorithm(algorithm: str) -> str:
    if algorithm not in ALGORITHM_CHOICES:
        allowed = ", ".join(ALGORITHM_CHOICES)
        raise ValueError(f"algorithm={algorithm!r} is unknown; allowed values: {allowed}")
    return algorithm


def tuner_of(comm: Communicator) -> AllReduceTuner:
    """The communicator's tuner; one priced from `default_link(comm)` is attached first
    when it has none (uncalibrated: MPICH's α–β choice on an assumed link)."""
    if comm.tuner is None:
        comm.tuner = AllReduceTuner.from_link(default_link(comm))
    return comm.tuner


def all_reduce(
    tensor: torch.Tensor,
    comm: Communicator,
    *,
    op: str = "sum",
    algorithm: str = "ring",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce `tensor` over all ranks; in place, or into `out` leaving `tensor` intact.

    `algorithm="auto"` runs what `comm.tuner` predicts fastest for this buffer's bytes and
    the group size (every rank predicts the same from the same table); the tuner's
    `last_choice` names it.
    """
    check_op(op)
    check_algorithm(algorithm)
    comm.count_call("all_reduce")
    target = tensor
    if out is not None:
        if out.shape != tensor.shape or out.dtype != tensor.dtype:
            raise ValueError("out must have the shape and dtype of tensor")
        out.copy_(tensor)
        target = out
    work = target if target.is_contiguous() else target.contiguous()
    if algorithm == AUTO:
        nbytes = work.numel() * work.element_size()
        algorithm = tuner_of(comm).choose(nbytes, comm.world_size)
    ALGORITHMS[algorithm].run(flat_view(work), comm, op)
    finish(work, op, comm.world_size)
    if work is not target:
        target.copy_(work)
    return target
