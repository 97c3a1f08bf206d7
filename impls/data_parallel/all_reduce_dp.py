"""DP 1.1: every rank holds the weights and the optimizer; gradients are all-reduced.

The lecture's step after the parameter server: instead of pushing gradients to one
server and pulling weights back, the ranks all-reduce the gradients among themselves and
each applies the same update to its own replica. With a bandwidth-optimal algorithm
(ring, recursive halving) every rank moves 2(N−1)/N of the gradient bytes, O(1) in N,
where the server moved O(N).

This is the naive version: after backward, all gradients are flattened into one buffer,
all-reduced with the chosen algorithm, and copied back. `DDP` (ddp.py) does the same in
buckets that overlap backward.
"""

from __future__ import annotations

import torch
from torch import nn

from impls.collectives import all_reduce, check_algorithm
from impls.comm import Communicator
from impls.data_parallel.common import (
    DataParallelBase,
    OptimizerFactory,
    ReplicaOptimizer,
    SyncTimeline,
    broadcast_parameters,
    unflatten_into,
)

__all__ = ["AllReduceDP"]


class AllReduceDP(DataParallelBase):
    """Data parallelism by one all-reduce of all gradients after backward (DP 1.1).

    `comm`: the data-parallel group. `algorithm`: any of `impls.collectives.ALGORITHMS`.
    The replicas start from rank 0's weights. In fp16/bf16 the all-reduce runs in the
    gradient dtype and the optimizer updates fp32 master weights.
    """

    def __init__(
        self,
        module: nn.Module,
        comm: Communicator,
        optimizer: OptimizerFactory,
        *,
        algorithm: str = "ring",
        precision: str = "fp32",
        loss_scale: str | float | None = None,
    ) -> None:
        super().__init__(module, comm, precision, loss_scale)
        self.algorithm = check_algorithm(algorithm)
        broadcast_parameters(self.params, comm)
        self.updater = ReplicaOptimizer(self.params, optimizer, precision, loss_scale)

    @property
    def loss_scale(self) -> float | None:
        return self.updater.loss_scale

    def synchronize_and_step(self) -> tuple[bool, SyncTimeline | None]:
        grads = self.local_grads()
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat.div_(self.comm.world_size)
        all_reduce(flat, self.comm, op="sum", algorithm=self.algorithm)
        unflatten_into(grads, flat)
        return self.updater.step(self.comm), None
