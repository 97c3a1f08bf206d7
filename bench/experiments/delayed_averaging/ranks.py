"""What one rank does in a `delayed_averaging` cell: train the task under a simulated
link, synchronously or with delayed gradient averaging, and time it.

What a cell does on each rank, step by step: `run`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from bench.experiments.base import Cell
from bench.experiments.delayed_averaging.config import DelayedAveragingConfig
from bench.kit.tasks import Task, build_task, cosine
from bench.kit.timing import timed_step
from bench.kit.workloads import rank_shard
from impls.comm import Communicator, SimulatedNetwork
from impls.data_parallel import AllReduceDP, DelayedAveragingDP

__all__ = ["Link", "run"]


@dataclass(frozen=True)
class Link:
    """The cell's simulated link: its latency per round and bandwidth (None: unlimited)."""

    latency_ms: float
    bandwidth_mbps: float | None = None

    def network(self) -> SimulatedNetwork:
        units = {"latency_ms": self.latency_ms}
        if self.bandwidth_mbps is not None:
            units["bandwidth_mbps"] = self.bandwidth_mbps
        return SimulatedNetwork.from_units(**units)


def _warm_up(task: Task) -> None:
    """One untimed forward and backward (first-call costs: allocator, autograd, kernels),
    gradients discarded, then a barrier so every rank starts the clock together."""
    x, y = task.batches(0)
    task.loss(task.model(rank_shard(x)), rank_shard(y)).backward()
    task.model.zero_grad(set_to_none=True)
    dist.barrier()


def _data_parallel(
    cfg: DelayedAveragingConfig, cell: Cell, task: Task
) -> AllReduceDP | DelayedAveragingDP:
    network = cell.carry.network()

    def optimizer(params):
        return torch.optim.SGD(params, lr=cfg.lr)

    if cell.key["method"] == "sync":
        comm = Communicator()
        dp = AllReduceDP(task.model, comm, optimizer, algorithm="parallel")
        comm.network = network  # the link carries training only, not the setup broadcast
        return dp
    return DelayedAveragingDP(
        task.model,
        Communicator(),
        optimizer,
        delay=cell.key["delay"],
        algorithm="parallel",
        network=network,
    )


def run(cfg: DelayedAveragingConfig, cell: Cell) -> dict[str, Any]:
    """One rank of a cell: `cfg.steps` timed steps, held-out evaluations between them.

    - `sync`: `AllReduceDP` — every step all-reduces its gradients and waits for the link
      (the communicator holds each round for latency + bytes/bandwidth);
    - `dga`: `DelayedAveragingDP` with delay D — each step goes on with its own gradient
      while the average is in flight, and is corrected when it arrives D steps later
      (Zhu et al., NeurIPS 2021).

    Both all-reduce with the one-round "parallel" algorithm (the latency-optimal choice: one
    link latency per average) and plain SGD, the update DGA's correction is exact for. Each
    training step is timed by the kit (`bench.kit.timing.timed_step`: barrier-opened, the
    slowest rank's time), and the clock is the sum of those steps: the training time only.
    Held-out accuracy is measured every `eval_every` steps with the clock stopped, on rank
    0's replica as it is at that moment (for DGA, with the corrections still in flight not
    yet applied); after the last step DGA's `finish()` applies them and its wait is counted.
    """
    task = build_task(cfg.task, cfg.batch_size, cfg.seed)
    dga = cell.key["method"] == "dga"
    dp = _data_parallel(cfg, cell, task)
    schedule = torch.optim.lr_scheduler.LambdaLR(dp.updater.optimizer, cosine(cfg.steps))
    _warm_up(task)
    clock, waited, evals, losses = 0.0, 0.0, [], []
    try:
        for step in range(cfg.steps):
            x, y = (rank_shard(batch) for batch in task.batches(step))
            stats, seconds, _ = timed_step(functools.partial(dp.train_step, x, y, task.loss))
            clock += seconds
            waited += getattr(stats, "waited_s", 0.0)
            schedule.step()
            losses.append(stats.loss)
            if (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                evals.append((step + 1, clock, *task.evaluate()))
        if dga:
            last_wait, seconds, _ = timed_step(dp.finish)
            waited += last_wait
            clock += seconds
        evals.append((cfg.steps, clock, *task.evaluate()))
    finally:
        if dga:
            dp.close()
    if not dga:
        waited = dp.comm.simulated_s  # the holding link: every simulated second is waited
    link = dp.sync_comm if dga else dp.comm
    return {
        "evals": evals,
        "losses": losses,
        "train_time_s": clock,
        "waited_s": waited,
        "simulated_s": link.simulated_s,
    }
