"""The naive pipeline: one batch, no micro-batching (the lecture's 25% case).

Stage s runs its forward once stage s−1 has finished, then waits until the backward
comes back through every later stage. Only one rank computes at any moment, so with P
stages and equal work per stage utilization is 1/P (Huang et al. 2019, GPipe, Fig. 2b).
"""

from __future__ import annotations

from impls.pipeline.actions import Action, Plan
from impls.pipeline.schedules._checks import require_count
from impls.pipeline.schedules.spec import ScheduleSpec
from impls.pipeline.theory import naive_utilization

__all__ = ["NAIVE", "naive", "naive_inflight"]


def naive(stages: int, microbatches: int = 1) -> Plan:
    """Rank r: `rF0, rB0`. `microbatches` must be 1: splitting the batch is GPipe's idea."""
    require_count("stages", stages)
    if microbatches != 1:
        raise ValueError(
            f"microbatches={microbatches!r}: schedule 'naive' does no micro-batching, "
            "so microbatches must be 1 (use 'gpipe' or '1f1b' to split the batch)"
        )
    return {rank: [Action(rank, "F", 0), Action(rank, "B", 0)] for rank in range(stages)}


def naive_inflight(stages: int, microbatches: int, virtual_stages: int = 1) -> list[int]:
    """One micro-batch (the whole batch) held on every rank until its backward."""
    return [1] * stages


NAIVE = ScheduleSpec(
    name="naive",
    build=naive,
    label="naive",
    utilization=lambda p, m, v: naive_utilization(p),
    bound_source="1/P — GPipe (Huang et al. 2019), Fig. 2b",
    inflight=naive_inflight,
    marker="D",
    microbatched=False,
)
