"""Data parallelism with compressed gradients (the lecture's "gradient compression").

After backward every rank hands its gradients to a `Compressor`, whose `aggregate`
moves them (all-gather of payloads, or all-reduce for linear compressors) and returns the
average of what every rank sent, decoded; every replica then steps with that average.
Error feedback, momentum correction (DGC) and PowerSGD's factors live in the compressor,
per parameter name, so they persist across steps.

`compressor=None` is the uncompressed baseline: one fp32 ring all-reduce of all
gradients (DP 1.1), so both paths count their bytes through the same `Communicator`.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from impls.comm import Communicator
from impls.compression import Compressor
from impls.compression.exchange import all_reduce_average
from impls.data_parallel.common import (
    DataParallelBase,
    OptimizerFactory,
    ReplicaOptimizer,
    SyncTimeline,
    broadcast_parameters,
)

__all__ = ["CompressedDP"]


class CompressedDP(DataParallelBase):
    """One rank's replica stepping with the rank-average of compressed gradients.

    fp32 only: compressed communication is the point, and a loss scaler's overflow check
    would need the uncompressed gradients of every rank.
    """

    def __init__(
        self,
        module: nn.Module,
        comm: Communicator,
        optimizer: OptimizerFactory,
        compressor: Compressor | None,
        *,
        algorithm: str = "ring",
    ) -> None:
        super().__init__(module, comm, "fp32", None)
        if compressor is not None and not isinstance(compressor, Compressor):
            raise TypeError(
                f"compressor must be an impls.compression.Compressor, got {compressor!r}"
            )
        self.compressor = compressor
        self.algorithm = algorithm
        broadcast_parameters(self.params, comm)
        self.updater = ReplicaOptimizer(self.params, optimizer, "fp32", None)
        self.last_sync_s = 0.0  # the last step's exchange: compress + collectives + decode

    @property
    def loss_scale(self) -> float | None:
        return None

    def synchronize_and_step(self) -> tuple[bool, SyncTimeline | None]:
        grads = self.local_grads()
        start = time.perf_counter()
        if self.compressor is None:
            averaged = all_reduce_average(grads, self.comm, torch.float32, self.algorithm)
        else:
            averaged = self.compressor.aggregate(
                list(zip(self.param_names, grads, strict=True)), self.comm
            )
        self.last_sync_s = time.perf_counter() - start
        for p, avg in zip(self.params, averaged, strict=True):
            p.grad = avg.view_as(p).to(p.dtype)
        return self.updater.step(self.comm), None
