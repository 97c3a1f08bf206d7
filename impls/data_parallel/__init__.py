"""Data parallelism: the parameter server (DP 1.0), all-reduce DP (DP 1.1), bucketed DDP
whose all-reduces overlap backward, and delayed gradient averaging. Every variant wraps
one rank's full replica of a module and exposes the same step::

    dp = DDP(model, comm, lambda params: torch.optim.Adam(params, lr=1e-3), algorithm="ring")
    with dp:  # DDP only: stops its communication thread
        x, y = (shard_batch(t, comm.rank, comm.world_size) for t in (inputs, targets))
        stats = dp.train_step(x, y, MLP.loss)  # forward, backward, sync, step

`ParameterServerDP`: rank 0 serves; `AllReduceDP`: one all-reduce after backward, any
algorithm; `DDP`: buckets all-reduced during backward on a communication thread;
`DelayedAveragingDP` (Zhu et al., NeurIPS 2021): each rank steps on its own gradient, the
average applied `delay` steps later. Each class documents its arguments; what they share
(the optimizer factory, `train_step`, a loop of its own) is `common.DataParallelBase`.
"""

from impls.data_parallel.all_reduce_dp import AllReduceDP
from impls.data_parallel.buckets import assign_buckets
from impls.data_parallel.common import (
    BucketTiming,
    LossFn,
    OptimizerFactory,
    ReplicaOptimizer,
    StepStats,
    SyncTimeline,
    shard_batch,
)
from impls.data_parallel.ddp import DDP, DEFAULT_BUCKET_CAP_BYTES
from impls.data_parallel.delayed import DelayedAveragingDP, DelayedStepStats
from impls.data_parallel.parameter_server import ParameterServerDP

__all__ = [
    "DDP",
    "DEFAULT_BUCKET_CAP_BYTES",
    "AllReduceDP",
    "BucketTiming",
    "DelayedAveragingDP",
    "DelayedStepStats",
    "LossFn",
    "OptimizerFactory",
    "ParameterServerDP",
    "ReplicaOptimizer",
    "StepStats",
    "SyncTimeline",
    "assign_buckets",
    "shard_batch",
]
