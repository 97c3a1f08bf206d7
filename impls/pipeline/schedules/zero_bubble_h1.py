"""ZB-H1: 1F1B with the backward split into I (input gradient) and W (weight gradient).

Qi, Wan, Huang & Lin 2024, "Zero Bubble Pipeline Parallelism" (ICLR 2024), §2.1 and
Fig. 3 (top). Only I lies on the critical path back through the pipeline — stage s−1
needs stage s's input gradient, never its weight gradient — so the backward wave travels
at the speed of I alone, and W can wait to fill what would otherwise be idle time.

Rank r keeps 1F1B's warm-up of min(P−r−1, M) forwards and its 1F-1I rhythm, but holds
back its weight gradients: it runs W(m) only once r later I's are done, and drains the
deferred W's at the end, exactly where 1F1B's cool-down leaves rank r idle. A rank with
fewer warm-up forwards defers more W's, so every rank holds at most P micro-batches'
activations — 1F1B's peak (rank 0's) — counting a micro-batch as held until its W. With
F = I = W the bubble is (P−1)(F+I−W) per rank, a third of 1F1B's (P−1)(F+I+W).
"""

from __future__ import annotations

from collections import deque

from impls.pipeline.actions import Action, Plan
from impls.pipeline.schedules.one_f_one_b import one_f_one_b
from impls.pipeline.schedules.spec import ScheduleSpec
from impls.pipeline.theory import zero_bubble_h1_utilization

__all__ = ["ZERO_BUBBLE_H1", "zero_bubble_h1", "zero_bubble_h1_inflight"]


def zero_bubble_h1(stages: int, microbatches: int) -> Plan:
    """Rank r: 1F1B's order with each B split into I then W, each W deferred by r I's."""
    plan: Plan = {}
    for rank, actions in one_f_one_b(stages, microbatches).items():
        split: list[Action] = []
        deferred: deque[int] = deque()
        for action in actions:
            if action.kind != "B":
                split.append(action)
                continue
            split.append(Action(rank, "I", action.microbatch))
            deferred.append(action.microbatch)
            if len(deferred) > rank:
                split.append(Action(rank, "W", deferred.popleft()))
        plan[rank] = split + [Action(rank, "W", m) for m in deferred]
    return plan


def zero_bubble_h1_inflight(stages: int, microbatches: int, virtual_stages: int = 1) -> list[int]:
    """min(P, M) on every rank: each holds a micro-batch until its late W (Qi et al. 2024 §2.1)."""
    return [min(stages, microbatches)] * stages


ZERO_BUBBLE_H1 = ScheduleSpec(
    name="zero_bubble_h1",
    build=zero_bubble_h1,
    label="ZB-H1",
    utilization=lambda p, m, v: zero_bubble_h1_utilization(p, m),
    bound_source="3M/(3M+P−1), T_F = T_I = T_W, M ≥ P — Qi et al. 2024, §2.1",
    inflight=zero_bubble_h1_inflight,
    marker="v",
    split_backward=True,
    planner=True,
)
