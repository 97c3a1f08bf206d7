"""Data parallelism: the parameter server (DP 1.0), all-reduce DP (DP 1.1), and bucketed
DDP whose all-reduces overlap backward.

Every variant wraps one rank's full replica of a module and exposes the same step::

    dp = DDP(model, comm, lambda params: torch.optim.Adam(params, lr=1e-3),
             algorithm="ring", bucket_cap_bytes=2**20, precision="fp16", loss_scale="dynamic")
    with dp:                                          # DDP only: stops its comm thread
        for inputs, targets in batches:               # the global batch, same on all ranks
            x = shard_batch(inputs, comm.rank, comm.world_size)
            y = shard_batch(targets, comm.rank, comm.world_size)
            stats = dp.train_step(x, y, MLP.loss)     # forward, backward, sync, step

- `ParameterServerDP(module, comm, optimizer, *, precision, loss_scale)`: rank 0 is the
  server (holds the optimizer; also computes on its shard).
- `AllReduceDP(module, comm, optimizer, *, algorithm, precision, loss_scale)`: one
  all-reduce of all gradients after backward, with any of `impls.collectives.ALGORITHMS`.
- `DDP(module, comm, optimizer, *, bucket_cap_bytes, algorithm, overlap, sync_group,
  precision, loss_scale)`: buckets all-reduced during backward on a communication
  thread over `sync_group`; `overlap=False` all-reduces the same buckets after backward.
- `DelayedAveragingDP(module, comm, optimizer, *, delay, algorithm, sync_group, network)`:
  delayed gradient averaging (Zhu et al., NeurIPS 2021): each rank steps on its own
  gradient at once and swaps in the rank average `delay` steps later; `finish()` applies
  the averages still in flight (fp32).

`optimizer` is a factory: it receives the parameters to update (the model's in fp32, the
fp32 master copy in fp16/bf16) and returns a `torch.optim.Optimizer`. The module is cast
to the precision's dtype in place; every replica starts from rank 0's weights.
`train_step` returns a `StepStats`: this rank's loss, whether the step was applied (a
loss scaler skips overflowing steps on every rank alike), the loss scale used, the
traffic this rank moved (`TrafficCounters`), and for DDP a `SyncTimeline` of every
bucket's ready/start/finish times against the end of backward.

A training loop of its own replaces `train_step` with its three parts: `out = dp(x)`;
`(loss * dp.loss_scale).backward()` (or plain `loss.backward()` when `dp.loss_scale` is
None); `stepped, timeline = dp.synchronize_and_step()`. For DDP that call first waits
for the bucket all-reduces (`dp.finish_gradient_sync()`).
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
