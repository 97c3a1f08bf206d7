"""GPipe: every micro-batch's forward, then every micro-batch's backward.

Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using Pipeline
Parallelism", Fig. 2c. Splitting the batch into M micro-batches lets stage s work on
micro-batch m while stage s+1 works on m−1; the fill and drain ramps leave a bubble of
(P−1)/(M+P−1) of each rank's time. Each rank keeps all M micro-batches' activations
until its backward phase starts, which is what 1F1B later avoids.

Backwards run in *reverse* micro-batch order (M−1 first), as in the paper's figure: the
last stage starts with the micro-batch whose forward it has just finished. The order does
not change the timeline when all micro-batches cost the same.
"""

from __future__ import annotations

from impls.pipeline.actions import Action, Plan
from impls.pipeline.schedules._checks import require_count
from impls.pipeline.schedules.spec import ScheduleSpec
from impls.pipeline.theory import gpipe_utilization

__all__ = ["GPIPE", "gpipe", "gpipe_inflight"]


def gpipe(stages: int, microbatches: int) -> Plan:
    """Rank r: `rF0 … rF(M−1), rB(M−1) … rB0`."""
    require_count("stages", stages)
    require_count("microbatches", microbatches)
    return {
        rank: [Action(rank, "F", m) for m in range(microbatches)]
        + [Action(rank, "B", m) for m in reversed(range(microbatches))]
        for rank in range(stages)
    }


def gpipe_inflight(stages: int, microbatches: int, virtual_stages: int = 1) -> list[int]:
    """All M micro-batches on every rank: the backward phase starts after the last forward."""
    return [microbatches] * stages


GPIPE = ScheduleSpec(
    name="gpipe",
    build=gpipe,
    label="GPipe",
    utilization=lambda p, m, v: gpipe_utilization(p, m),
    bound_source="M/(M+P−1) — GPipe (Huang et al. 2019), §2.3",
    inflight=gpipe_inflight,
    marker="o",
    planner=True,
)
