"""ZB-H2: zero bubble at equal costs, bought with more warm-up forwards (more memory).

Qi, Wan, Huang & Lin 2024, "Zero Bubble Pipeline Parallelism" (ICLR 2024), §2.2 and
Fig. 3 (bottom). ZB-H1 keeps 1F1B's memory, so its ramps still idle (P−1)(T_F+T_I−T_W)
per rank. ZB-H2 lets every rank hold up to 2P−1 micro-batches: the extra warm-up
forwards fill the ramp before the first input gradient arrives, and each rank keeps 2r
weight gradients back for the drain after its last `I`, where it would otherwise wait
on the gradients of later stages. With T_F = T_I = T_W no rank idles between its first
and last action: rank r works without a gap from r·T_F to r·T_F + M(T_F+T_I+T_W), the
paper's parallelogram (which its optimizer post-validation tiles across iterations; a
synchronous step still sees the (P−1)·T_F skew, see `impls.pipeline.theory`).
"""

from __future__ import annotations

from impls.pipeline.actions import Plan
from impls.pipeline.schedules._checks import require_count
from impls.pipeline.schedules._greedy import StageCosts, fastest, greedy_plan
from impls.pipeline.schedules.spec import COUNTED_ON_PLAN, ScheduleSpec
from impls.pipeline.theory import zero_bubble_h2_utilization

__all__ = ["ZERO_BUBBLE_H2", "zero_bubble_h2"]


def zero_bubble_h2(stages: int, microbatches: int, costs: StageCosts | None = None) -> Plan:
    """Rank r: up to 2P−1 micro-batches in flight, W's fill gaps, 2r W's kept for the drain.

    The order is built by the unit-time list scheduler of `_greedy` (input gradients first,
    then forwards under the limit, then weight gradients), as the paper builds its schedules.
    The zero-bubble claim needs M ≥ 2P−1; with fewer micro-batches the plan still runs.

    `costs` (the paper's automatic scheduler, §3): each stage's profiled F, I and W seconds
    (one mapping for all stages, or one per stage). The same policy is then run on simulated
    time, under the same limits, and the plan kept is whichever of that order and the
    unit-time one replays faster at those costs (`_greedy.fastest`); without `costs`, the
    unit-time order.
    """
    require_count("stages", stages)
    require_count("microbatches", microbatches)
    limits = [2 * stages - 1] * stages
    reserves = [2 * r for r in range(stages)]
    placement = list(range(stages))
    return fastest(
        lambda c: greedy_plan(placement, microbatches, limits, reserves, c), costs, placement
    )


# Not searched by the planner (yet): its bounds were written for ZB-H1's in-flight count.
ZERO_BUBBLE_H2 = ScheduleSpec(
    name="zero_bubble_h2",
    build=zero_bubble_h2,
    label="ZB-H2",
    utilization=lambda p, m, v: zero_bubble_h2_utilization(p, m),
    bound_source="3M/(3M+P−1) (no idle inside any rank's span; the (P−1)·T_F ramp "
    "skew remains in a synchronous step), T_F = T_I = T_W, M ≥ 2P−1 — Qi et al. 2024, §2.2",
    inflight=COUNTED_ON_PLAN,  # at most 2P − 1 (`theory.zero_bubble_max_inflight`)
    marker="P",
    split_backward=True,
    needs_m_ge_p=True,
)
