"""What one rank does in a `delayed_averaging` cell: train the digits task under a
simulated link, synchronously or with delayed gradient averaging, and time it.

- `sync`: `AllReduceDP` — every step all-reduces its gradients and waits for the link
  (the communicator holds each round for latency + bytes/bandwidth);
- `dga`: `DelayedAveragingDP` with delay D — each step goes on with its own gradient
  while the average is in flight, and is corrected when it arrives D steps later
  (Zhu et al., NeurIPS 2021).

Both all-reduce with the one-round "parallel" algorithm (the latency-optimal choice: one
link latency per average) and plain SGD, the update DGA's correction is exact for. The
clock is the training time only: held-out accuracy is measured every `eval_every` steps
with the clock stopped, on rank 0's replica as it is at that moment (for DGA, with the
corrections still in flight not yet applied); after the last step DGA's `finish()`
applies them and its wait is counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from bench.kit.tasks import build_task, cosine
from impls.comm import Communicator, SimulatedNetwork
from impls.data_parallel import AllReduceDP, DelayedAveragingDP, shard_batch

__all__ = ["DGACell", "METHODS", "run_dga_cell"]

METHODS = ("sync", "dga")


@dataclass(kw_only=True)
class DGACell:
    method: str
    delay: int
    latency_ms: float
    bandwidth_mbps: float | None = None
    task: str = "digits"
    steps: int = 300
    batch_size: int = 64
    lr: float = 0.2
    seed: int = 0
    eval_every: int = 10
    target_accuracy: float = 0.95  # carried to the row; the report reads it


def _warm_up(task, rank: int, world: int) -> None:
    """One untimed forward and backward (first-call costs: allocator, autograd, kernels),
    gradients discarded, then a barrier so every rank starts the clock together."""
    x, y = task.batches(0)
    task.loss(task.model(shard_batch(x, rank, world)), shard_batch(y, rank, world)).backward()
    task.model.zero_grad(set_to_none=True)
    dist.barrier()


def run_dga_cell(cell: DGACell) -> dict[str, Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    task = build_task(cell.task, cell.batch_size, cell.seed)
    units = {"latency_ms": cell.latency_ms}
    if cell.bandwidth_mbps is not None:
        units["bandwidth_mbps"] = cell.bandwidth_mbps
    network = SimulatedNetwork.from_units(**units)

    def optimizer(params):
        return torch.optim.SGD(params, lr=cell.lr)

    if cell.method == "sync":
        comm = Communicator()
        dp = AllReduceDP(task.model, comm, optimizer, algorithm="parallel")
        comm.network = network  # the link carries training only, not the setup broadcast
    else:
        dp = DelayedAveragingDP(task.model, Communicator(), optimizer, delay=cell.delay,
                                algorithm="parallel", network=network)  # fmt: skip
    schedule = torch.optim.lr_scheduler.LambdaLR(dp.updater.optimizer, cosine(cell.steps))
    _warm_up(task, rank, world)
    clock, waited, evals, losses = 0.0, 0.0, [], []
    try:
        for step in range(cell.steps):
            x, y = task.batches(step)
            x, y = shard_batch(x, rank, world), shard_batch(y, rank, world)
            start = time.perf_counter()
            stats = dp.train_step(x, y, task.loss)
            clock += time.perf_counter() - start
            waited += getattr(stats, "waited_s", 0.0)
            schedule.step()
            losses.append(stats.loss)
            if (step + 1) % cell.eval_every == 0 and step + 1 < cell.steps:
                evals.append((step + 1, clock, *task.evaluate()))
        if cell.method == "dga":
            start = time.perf_counter()
            waited += dp.finish()
            clock += time.perf_counter() - start
        evals.append((cell.steps, clock, *task.evaluate()))
    finally:
        if cell.method == "dga":
            dp.close()
    if cell.method == "sync":
        waited = dp.comm.simulated_s  # the holding link: every simulated second is waited
    link = dp.comm if cell.method == "sync" else dp.sync_comm
    return {"evals": evals, "losses": losses, "train_time_s": clock, "waited_s": waited,
            "simulated_s": link.simulated_s}  # fmt: skip
