"""1F1B (PipeDream-Flush): warm up with a few forwards, then alternate one forward, one backward.

Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training" (PipeDream-2BW /
PipeDream-Flush), and §2.2.1 of "Efficient Large-Scale Language Model Training on GPU
Clusters". Rank r first runs min(P−r−1, M) forwards — just enough that the first
backward reaches it when it would otherwise go idle — then one forward and one backward in
turn, then drains the remaining backwards. The bubble equals GPipe's, (P−1)/(M+P−1), but a
rank never holds more than min(P−r, M) micro-batches' activations (rank 0 holds P) instead
of M.
"""

from __future__ import annotations

from impls.pipeline.actions import Action, Plan
from impls.pipeline.schedules._checks import require_count
from impls.pipeline.schedules.spec import ScheduleSpec
from impls.pipeline.theory import one_f_one_b_utilization

__all__ = ["ONE_F_ONE_B", "one_f_one_b", "one_f_one_b_inflight"]


def one_f_one_b(stages: int, microbatches: int) -> Plan:
    """Rank r: warm-up forwards, steady 1F/1B pairs, cool-down backwards (all in order)."""
    require_count("stages", stages)
    require_count("microbatches", microbatches)
    plan: Plan = {}
    for rank in range(stages):
        warmup = min(stages - rank - 1, microbatches)
        actions = [Action(rank, "F", m) for m in range(warmup)]
        for m in range(microbatches - warmup):
            actions += [Action(rank, "F", warmup + m), Action(rank, "B", m)]
        actions += [Action(rank, "B", m) for m in range(microbatches - warmup, microbatches)]
        plan[rank] = actions
    return plan


def one_f_one_b_inflight(stages: int, microbatches: int, virtual_stages: int = 1) -> list[int]:
    """Rank r holds min(P − r, M) (Narayanan et al. 2021 §2.2.1)."""
    return [min(stages - r, microbatches) for r in range(stages)]


ONE_F_ONE_B = ScheduleSpec(
    name="1f1b",
    build=one_f_one_b,
    label="1F1B",
    utilization=lambda p, m, v: one_f_one_b_utilization(p, m),
    bound_source="M/(M+P−1) — Narayanan et al. 2021, §2.2.1",
    inflight=one_f_one_b_inflight,
    marker="s",
    planner=True,
)
