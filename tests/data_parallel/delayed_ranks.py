"""What the delayed-gradient-averaging tests run *inside* pool ranks (module-level).

Every rank of the pool calls these with the same arguments; the first k ranks train and
the others return None. Process groups are created by every rank in the same order
(`prefix_communicator`, `sync_group`) before the non-members drop out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from impls.comm.network import SimulatedNetwork
from impls.data_parallel import DelayedAveragingDP, shard_batch
from impls.models import MLP
from tests.data_parallel.dp_ranks import MLP_CFG, Case, sync_group
from tests.rank_support import prefix_communicator

LR = 0.1  # Case's SGD learning rate


@dataclass(frozen=True)
class DelayedCase:
    """One DGA training run of the small MLP with SGD on the first `world_size` ranks."""

    world_size: int
    delay: int
    steps: int
    algorithm: str = "parallel"
    own_group: bool = False  # sync_group=None: the instance creates (and destroys) one

    @property
    def data(self) -> Case:
        """The `Case` whose batches (and, for delay=0, full-batch reference) are used."""
        return Case("allreduce", self.world_size, "sgd", steps=self.steps)


def run_delayed(cases: list[DelayedCase]) -> list[dict | None]:
    """Train every case; per case, what this rank saw (None if it is not a member)."""
    return [_run(case) for case in cases]


def _run(case: DelayedCase) -> dict | None:
    comm = prefix_communicator(case.world_size)
    group = sync_group(case.world_size)
    if comm is None:
        return None
    with DelayedAveragingDP(
        MLP(MLP_CFG, seed=0),
        comm,
        case.data.make_optimizer,
        delay=case.delay,
        algorithm=case.algorithm,
        sync_group=None if case.own_group else group,
    ) as dp:
        losses, applied, in_flight = [], [], []
        for x, y in case.data.batches():
            x = shard_batch(x, comm.rank, comm.world_size)
            y = shard_batch(y, comm.rank, comm.world_size)
            stats = dp.train_step(x, y, MLP.loss)
            losses.append(stats.loss)
            applied.append(stats.applied_step)
            in_flight.append(dp.in_flight)
        before = _params(dp)
        dp.finish()
        after = _params(dp)
        owned = dp._owned_group is not None
    return {
        "losses": losses,
        "applied": applied,
        "in_flight": in_flight,
        "before_finish": before,
        "after_finish": after,
        "owned_group": owned,
        "closed_owned_group": dp._owned_group is None,
    }


def _params(dp: DelayedAveragingDP) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in dp.module.named_parameters()}


COMPUTE_S = 0.025  # each step's loss sleeps this long: a stand-in for real compute
LATENCY_S = 0.1  # one round of the simulated link ("parallel" all-reduce: one round)


def _slow_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    time.sleep(COMPUTE_S)
    return MLP.loss(outputs, targets)


def timed_runs(k: int, delays: list[int], steps: int, repeats: int) -> dict[int, list] | None:
    """Per delay, per repeat: `steps` slowed steps + finish() over a 100 ms link, timed."""
    comm = prefix_communicator(k)
    group = sync_group(k)
    if comm is None:
        return None
    data = Case("allreduce", k, "sgd", steps=steps)
    batches = [
        (shard_batch(x, comm.rank, k), shard_batch(y, comm.rank, k)) for x, y in data.batches()
    ]
    out: dict[int, list] = {delay: [] for delay in delays}
    for _ in range(repeats):
        for delay in delays:
            with DelayedAveragingDP(
                MLP(MLP_CFG, seed=0),
                comm,
                data.make_optimizer,
                delay=delay,
                sync_group=group,
                network=SimulatedNetwork(latency_s=LATENCY_S),
            ) as dp:
                start = time.perf_counter()
                stats = [dp.train_step(x, y, _slow_loss) for x, y in batches]
                finish_waited = dp.finish()
                wall = time.perf_counter() - start
            out[delay].append(
                {
                    "wall_s": wall,
                    "waited_s": sum(s.waited_s for s in stats) + finish_waited,
                    "simulated_s": [s.simulated_s for s in stats],
                    "rounds": [s.traffic.rounds for s in stats],
                }
            )
    return out


def bad_delays() -> list[str]:
    """Each refused construction on 2 ranks: its error text, or 'accepted'."""
    comm = prefix_communicator(2)
    group = sync_group(2)
    if comm is None:
        return []
    sgd = Case("allreduce", 2).make_optimizer
    attempts = {
        "negative": {"delay": -1},
        "float": {"delay": 1.5},
        "bool": {"delay": True},
        "string": {"delay": "2"},
        "same group": {"delay": 1, "sync_group": comm.group},
        "bad algorithm": {"delay": 1, "sync_group": group, "algorithm": "butterfly"},
    }
    errors = []
    for name, kwargs in attempts.items():
        try:
            DelayedAveragingDP(MLP(MLP_CFG), comm, sgd, **kwargs).close()
            errors.append(f"{name}: accepted")
        except ValueError as err:
            errors.append(f"{name}: {err}")
    return errors
