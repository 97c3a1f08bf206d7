"""ZB-H2 and ZB-V built from stage costs (the Zero Bubble paper's automatic scheduler).

`costs` runs the schedules' list policies on simulated time instead of unit time, under
the same memory limits, and keeps whichever order replays faster. A failure means equal
costs no longer give the fixed plans, a cost-built plan breaks validation or the memory
limit, or the costs made a plan slower than the unit-time one on those very costs.
"""

from __future__ import annotations

import pytest

from impls.pipeline.replay import max_inflight_microbatches, replay
from impls.pipeline.schedules import stage_ranks, zero_bubble_h2, zero_bubble_v
from impls.pipeline.schedules._greedy import greedy_plan, v_plan
from impls.pipeline.validate import validate

# Measured per-stage costs of the pipeline_utilization GPT at P = 4 (ms): W ≈ F/2.
MEASURED = {"F": 6.0, "I": 5.5, "W": 3.1}
HALF_W = {"F": 1.0, "I": 1.0, "W": 0.5}


def _chunks(costs: dict[str, float]) -> dict[str, float]:
    return {kind: cost / 2 for kind, cost in costs.items()}  # ZB-V's chunk: half a stage


def _v_makespan(plan, p: int, costs) -> float:
    placed = stage_ranks("zero_bubble_v", p, 2)
    return replay(plan, costs, num_stages=2 * p, stage_ranks=placed).makespan


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 4), (4, 8), (4, 16)])
def test_equal_costs_reproduce_the_unit_time_plans(stages: int, microbatches: int) -> None:
    equal = {"F": 2.5, "I": 2.5, "W": 2.5}
    assert zero_bubble_h2(stages, microbatches, costs=equal) == zero_bubble_h2(stages, microbatches)
    assert zero_bubble_v(stages, microbatches, costs=equal) == zero_bubble_v(stages, microbatches)
    # the list schedule itself, before any choice between orders
    assert v_plan(stages, microbatches, 2 * stages, equal) == v_plan(
        stages, microbatches, 2 * stages
    )
    limits, reserves = [2 * stages - 1] * stages, [2 * r for r in range(stages)]
    placement = list(range(stages))
    assert greedy_plan(placement, microbatches, limits, reserves, [equal] * stages) == (
        greedy_plan(placement, microbatches, limits, reserves)
    )


@pytest.mark.parametrize("costs", [MEASURED, HALF_W])
@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 4), (4, 8), (4, 16)])
def test_a_cheaper_weight_gradient_never_makes_the_plan_slower(
    costs: dict[str, float], stages: int, microbatches: int
) -> None:
    p, m = stages, microbatches
    h2 = zero_bubble_h2(p, m, costs=costs)
    assert replay(h2, costs).makespan <= replay(zero_bubble_h2(p, m), costs).makespan
    chunk = _chunks(costs)
    v = zero_bubble_v(p, m, costs=chunk)
    assert _v_makespan(v, p, chunk) <= _v_makespan(zero_bubble_v(p, m), p, chunk)
    # the cost-built orders themselves are valid plans within the same memory limits
    tuned_h2 = greedy_plan(list(range(p)), m, [2 * p - 1] * p, [2 * r for r in range(p)], costs)
    tuned_v = v_plan(p, m, 2 * p, chunk)
    validate(tuned_h2, p, m)
    validate(tuned_v, p, m, 2, stage_ranks("zero_bubble_v", p, 2))
    assert max(max_inflight_microbatches(tuned_h2).values()) <= min(2 * p - 1, m)
    assert max(max_inflight_microbatches(tuned_v).values()) <= 2 * p


def test_the_measured_costs_change_zero_bubble_v_at_m_equal_p_and_it_gets_faster() -> None:
    chunk = _chunks(MEASURED)
    tuned, fixed = zero_bubble_v(4, 4, costs=chunk), zero_bubble_v(4, 4)
    assert tuned != fixed
    assert _v_makespan(tuned, 4, chunk) < _v_makespan(fixed, 4, chunk)


def test_per_stage_costs_must_cover_every_stage() -> None:
    with pytest.raises(ValueError, match="3 stages' costs given, the plan has 8"):
        zero_bubble_v(4, 8, costs=[MEASURED] * 3)
    with pytest.raises(ValueError, match=r"costs\[0\]"):
        zero_bubble_h2(2, 4, costs={"F": 1.0, "I": 1.0})
