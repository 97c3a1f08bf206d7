"""What the traffic tests run *inside* pool ranks (module-level, so ranks can unpickle it).

Each rank performs the collectives one training step of a ZeRO stage issues on a model cut
into flat units, with distbench's own collectives, and returns the bytes it sent. Every
rank of the pool calls `steps_traffic` with the same cases (one pool call for all of them);
ranks outside a case's first N report None for it.
"""

from __future__ import annotations

import math

import torch

from impls.collectives import all_gather, all_reduce, reduce_scatter
from tests.rank_support import prefix_communicator


def _padded(unit: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A unit's flat buffer padded to a multiple of N, and this rank's shard buffer."""
    shard = math.ceil(unit / n)
    return torch.ones(shard * n), torch.ones(shard)


def steps_traffic(cases: list[tuple[int, int]], units: list[int]) -> list[int | None]:
    """`step_traffic` for each (N, stage) in `cases`, in order."""
    return [step_traffic(n, stage, units) for n, stage in cases]


def step_traffic(n: int, stage: int, units: list[int]) -> int | None:
    """Bytes this rank sends in one step of `stage` over units of `units` fp32 elements.

    Stage 0 all-reduces each (unpadded) unit with the ring. Stages 1 and 2 reduce-scatter
    the padded gradients and all-gather the updated weights; stage 3 all-gathers the weights
    twice (forward, backward) and reduce-scatters the gradients once.
    """
    comm = prefix_communicator(n)
    if comm is None:
        return None
    with comm.measure() as traffic:
        for unit in units:
            full, shard = _padded(unit, n)
            if stage == 0:
                all_reduce(torch.ones(unit), comm, algorithm="ring")
                continue
            for _ in range(2 if stage == 3 else 1):
                all_gather(full, shard, comm)
            reduce_scatter(shard, full, comm)
    return traffic.bytes_sent
