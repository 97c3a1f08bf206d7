"""ZB-H2 and ZB-V replayed: the bounds of `impls.pipeline.theory`, met exactly.

With T_F = T_I = T_W and free transfers the replay is the papers' timeline. A failure
means ZB-H2 or ZB-V lost the shape its paper analyses (a rank idles inside its span,
the ramps grew, the V placement is replayed round-robin), holds more micro-batches than
the theory states, or a bound accepts a configuration it does not hold for.
"""

from __future__ import annotations

import pytest

from impls.pipeline.replay import max_inflight_microbatches, replay
from impls.pipeline.schedules import build_plan, stage_ranks, utilization_bound
from impls.pipeline.theory import (
    zero_bubble_h2_utilization,
    zero_bubble_max_inflight,
    zero_bubble_v_utilization,
)

SPLIT = {"F": 1.0, "I": 1.0, "W": 1.0}


def _idle_inside_spans(timeline) -> list[float]:
    """Per rank: idle time between its first action's start and its last action's end."""
    idle = []
    for rank, busy in enumerate(timeline.busy):
        spans = [s for s in timeline.spans if s.rank == rank]
        idle.append(max(s.end for s in spans) - min(s.start for s in spans) - busy)
    return idle


@pytest.mark.parametrize(
    ("stages", "microbatches"), [(2, 3), (2, 8), (4, 7), (4, 8), (4, 16), (8, 16)]
)
def test_zero_bubble_h2_has_no_idle_inside_any_rank_and_meets_its_bound(
    stages: int, microbatches: int
) -> None:
    plan = build_plan("zero_bubble_h2", stages, microbatches)
    timeline = replay(plan, SPLIT)
    assert _idle_inside_spans(timeline) == [0.0] * stages
    assert timeline.makespan == 3 * microbatches + stages - 1  # only the ramp skew remains
    assert timeline.utilization == pytest.approx(zero_bubble_h2_utilization(stages, microbatches))
    assert utilization_bound("zero_bubble_h2", stages, microbatches) == timeline.utilization
    peak = zero_bubble_max_inflight("zero_bubble_h2", stages, microbatches)
    assert max_inflight_microbatches(plan) == {r: peak for r in range(stages)}
    assert peak == min(2 * stages - 1, microbatches)


@pytest.mark.parametrize(
    ("stages", "microbatches"),
    [(1, 3), (2, 2), (2, 8), (3, 4), (3, 6), (4, 4), (4, 5), (4, 7), (4, 16), (6, 9), (8, 16)],
)
def test_zero_bubble_v_meets_its_bound_on_the_v_placement(stages: int, microbatches: int) -> None:
    plan = build_plan("zero_bubble_v", stages, microbatches, 2)
    placed = stage_ranks("zero_bubble_v", stages, 2)
    timeline = replay(plan, SPLIT, num_stages=2 * stages, stage_ranks=placed)
    assert timeline.makespan == 6 * microbatches + stages - 1  # in chunk units
    assert timeline.utilization == pytest.approx(zero_bubble_v_utilization(stages, microbatches))
    # M >= 2P−1: rank r works without a gap from r to r + 6M; fewer micro-batches leave rank
    # r 2P−1−M−r units short of work inside its span, still within the step's bound
    short = [max(0, 2 * stages - 1 - microbatches - r) for r in range(stages)]
    assert _idle_inside_spans(timeline) == short
    peak = zero_bubble_max_inflight("zero_bubble_v", stages, microbatches)
    assert max_inflight_microbatches(plan) == {r: peak for r in range(stages)}
    assert peak == 2 * stages  # 1F1B's activation memory: P micro-batches of two half-chunks


def test_with_a_cheaper_weight_gradient_h2_and_v_beat_h1_and_1f1b() -> None:
    """T_W < T_I: ZB-H1 idles (P−1)(F+I−W), ZB-H2 (P−1)F, ZB-V (P−1)F/2.

    Near-equal costs only: the orders are built at equal costs, and ZB-V's (two chunks
    interleaved per rank) is the one that degrades first when I grows (at I = 1.8 F it
    falls below ZB-H1; see the ZB-V module).
    """
    costs = {"F": 1.0, "I": 1.0, "W": 0.9, "B": 1.9}
    half = {kind: cost / 2 for kind, cost in costs.items()}
    p, m = 4, 8
    util = {
        name: replay(build_plan(name, p, m), costs).utilization
        for name in ("1f1b", "zero_bubble_h1", "zero_bubble_h2")
    }
    v_plan = build_plan("zero_bubble_v", p, m, 2)
    util["zero_bubble_v"] = replay(
        v_plan, half, num_stages=2 * p, stage_ranks=stage_ranks("zero_bubble_v", p, 2)
    ).utilization
    assert util["1f1b"] < util["zero_bubble_h1"] < util["zero_bubble_h2"] < util["zero_bubble_v"]


def test_replaying_zero_bubble_v_round_robin_is_refused_not_misread() -> None:
    with pytest.raises(ValueError, match="wait forever"):
        replay(build_plan("zero_bubble_v", 4, 8, 2), SPLIT, num_stages=8)


@pytest.mark.parametrize(
    ("call", "key"),
    [
        (lambda: zero_bubble_h2_utilization(4, 6), "microbatches=6"),
        (lambda: zero_bubble_v_utilization(4, 3), "microbatches=3"),
        (lambda: zero_bubble_max_inflight("1f1b", 4, 8), "schedule='1f1b'"),
        (lambda: utilization_bound("zero_bubble_v", 4, 2, 2), "microbatches=2"),
    ],
)
def test_bounds_refuse_configurations_they_do_not_hold_for(call, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace("(", r"\(")):
        call()
