"""ZB-V: two chunks per rank placed in a V, the split backward filling every ramp.

Qi, Wan, Huang & Lin, "Zero Bubble Pipeline Parallelism" (ICLR 2024), §6 / Fig. 8
(ZB-V), and "Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024),
§3 and Fig. 3 (the V-shape building block). The model is cut into 2P stages and rank r
holds stages r and 2P−1−r (`impls.pipeline.dataflow.v_shape`): the forward runs down the
ranks and back up, so rank 0 holds both the first stage and the last (the loss), stage
P−1 hands its activation to stage P without a message, and the first input gradient is
produced on the rank that also starts the forward. Every chunk is half a rank's layers,
so each ramp step costs half a 1F1B one.
"""

from __future__ import annotations

from impls.pipeline.actions import Plan
from impls.pipeline.schedules._checks import require_count
from impls.pipeline.schedules._greedy import StageCosts, fastest, v_plan
from impls.pipeline.schedules.spec import COUNTED_ON_PLAN, ScheduleSpec
from impls.pipeline.theory import zero_bubble_v_utilization

__all__ = ["ZERO_BUBBLE_V", "zero_bubble_v"]


def zero_bubble_v(
    stages: int, microbatches: int, virtual_stages: int = 2, costs: StageCosts | None = None
) -> Plan:
    """Rank r runs stages r and 2P−1−r, at most 2P (stage, micro-batch) pairs held.

    The order is the paper's V (built by `_greedy.v_plan`, a list schedule with a fixed
    preference): rank r runs 2P−1−2r forwards down its first chunk before micro-batch 0
    comes back up its second, alternates the two chunks' forwards until its first input
    gradient arrives, then repeats F, I, W triples, and drains the pending W's between its
    last input gradients. It holds at most 2P (chunk, micro-batch) pairs, a micro-batch
    counted on a chunk from its F to its W: P micro-batches' worth, 1F1B's peak activation
    memory, as the paper states for ZB-V. With equal chunk costs T_F = T_I = T_W the step
    takes 6M + P − 1 chunk units (M ≥ P), and for M ≥ 2P − 1 no rank idles between its
    first and last action (rank r works from r to r + 6M).

    `costs` (the paper's automatic scheduler, §3): each chunk's profiled F, I and W seconds
    (one mapping for all 2P chunks, or one per stage). The same policy is then run on
    simulated time, under the same 2P limit, and the plan kept is whichever of that order
    and the unit-time one replays faster at those costs (`_greedy.fastest`); without
    `costs`, the unit-time order.
    """
    require_count("stages", stages)
    require_count("microbatches", microbatches)
    if virtual_stages != 2:
        raise ValueError(
            f"virtual_stages={virtual_stages!r}: schedule 'zero_bubble_v' places exactly 2 "
            "chunks on each rank (stages r and 2P−1−r), so virtual_stages must be 2"
        )
    placement = tuple(range(stages)) + tuple(range(stages - 1, -1, -1))
    return fastest(lambda c: v_plan(stages, microbatches, 2 * stages, c), costs, placement)


# Not searched by the planner: its V placement of two chunks per rank is not a
# ParallelPlan layout.
ZERO_BUBBLE_V = ScheduleSpec(
    name="zero_bubble_v",
    build=zero_bubble_v,
    label="ZB-V",
    utilization=lambda p, m, v: zero_bubble_v_utilization(p, m),
    bound_source="6M/(6M+P−1) in half-stage chunks, T_F = T_I = T_W, M ≥ P — Qi et al. "
    "2024, §6, and Pipeline Parallelism with Controllable Memory, §3",
    inflight=COUNTED_ON_PLAN,  # at most 2P chunk pairs (`theory.zero_bubble_max_inflight`)
    marker="X",
    chunks="v_shape",
    split_backward=True,
    needs_m_ge_p=True,
)
