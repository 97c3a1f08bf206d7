"""Replayed timelines reproduce the lecture's utilization numbers and the papers' bounds.

With F = 1, B = 2 (or F = I = W = 1) and free transfers, a replay is the textbook
timeline. A failure here means either a schedule no longer has the shape its paper
analyses, or the replay mis-orders work — and the report's "replayed utilization" column
(lecture: naive 25%, GPipe 4×4 57%) would be wrong.
"""

from __future__ import annotations

import pytest

from impls.pipeline.actions import Action
from impls.pipeline.replay import max_inflight_microbatches, replay
from impls.pipeline.schedules import build_plan, utilization_bound
from impls.pipeline.theory import (
    gpipe_bubble_fraction,
    gpipe_utilization,
    interleaved_utilization,
    naive_utilization,
    zero_bubble_h1_bubble_time,
    zero_bubble_h1_utilization,
)
from impls.pipeline.validate import insert_communication

FULL = {"F": 1.0, "B": 2.0}
SPLIT = {"F": 1.0, "I": 1.0, "W": 1.0}  # B = I + W = 2, the same work as FULL


def _chunked(virtual_stages: int) -> dict[str, float]:
    """Per-action costs when each rank's layers are cut into V chunks."""
    return {kind: cost / virtual_stages for kind, cost in FULL.items()}


def test_naive_four_stages_is_exactly_25_percent() -> None:
    timeline = replay(build_plan("naive", 4, 1), FULL)
    assert timeline.makespan == 12.0  # 4 forwards then 4 backwards, one rank at a time
    assert timeline.utilization == 0.25 == naive_utilization(4)


def test_gpipe_four_stages_four_micro_batches_is_4_over_7() -> None:
    timeline = replay(build_plan("gpipe", 4, 4), FULL)
    assert timeline.makespan == 21.0  # (M + P − 1)(F + B)
    assert timeline.utilization == pytest.approx(4 / 7)  # 57.1%
    assert timeline.bubble_fraction == pytest.approx(gpipe_bubble_fraction(4, 4))
    assert replay(build_plan("1f1b", 4, 4), FULL).makespan == 21.0  # same bubble, less memory


@pytest.mark.parametrize("stages", [2, 4, 8])
@pytest.mark.parametrize("microbatches", [1, 2, 4, 8, 16, 32])
def test_gpipe_and_1f1b_meet_m_over_m_plus_p_minus_1(stages: int, microbatches: int) -> None:
    bound = gpipe_utilization(stages, microbatches)
    for name in ("gpipe", "1f1b"):
        assert replay(build_plan(name, stages, microbatches), FULL).utilization == pytest.approx(
            bound
        )


def test_utilization_rises_toward_one_with_more_micro_batches() -> None:
    curve = [replay(build_plan("1f1b", 4, m), FULL).utilization for m in (1, 2, 4, 8, 16, 32, 64)]
    assert curve == sorted(curve) and curve[0] == 0.25 and curve[-1] > 0.95


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 4), (4, 8), (4, 16), (8, 16)])
@pytest.mark.parametrize("virtual_stages", [2, 3])
def test_interleaved_beats_1f1b_and_meets_its_bound(
    stages: int, microbatches: int, virtual_stages: int
) -> None:
    plan = build_plan("interleaved_1f1b", stages, microbatches, virtual_stages)
    utilization = replay(plan, _chunked(virtual_stages)).utilization
    one_f_one_b = replay(build_plan("1f1b", stages, microbatches), FULL).utilization
    assert utilization > one_f_one_b
    assert utilization == pytest.approx(
        interleaved_utilization(stages, microbatches, virtual_stages)
    )


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 2), (4, 4), (4, 8), (8, 8), (8, 16)])
def test_zero_bubble_h1_beats_1f1b_and_meets_its_bound(stages: int, microbatches: int) -> None:
    zero_bubble = replay(build_plan("zero_bubble_h1", stages, microbatches), SPLIT)
    one_f_one_b = replay(build_plan("1f1b", stages, microbatches), FULL)
    assert sum(zero_bubble.busy) == sum(one_f_one_b.busy)  # same work, less idle
    assert zero_bubble.utilization > one_f_one_b.utilization
    assert zero_bubble.utilization == pytest.approx(
        zero_bubble_h1_utilization(stages, microbatches)
    )
    # A third of 1F1B's idle time per rank: (P−1)·1 against (P−1)·3.
    assert zero_bubble.makespan - 3 * microbatches == zero_bubble_h1_bubble_time(stages)


def test_zero_bubble_h1_bound_holds_for_unequal_costs_where_stated() -> None:
    for costs in ({"F": 1.0, "I": 1.0, "W": 0.5}, {"F": 1.0, "I": 2.0, "W": 1.0}):
        timeline = replay(build_plan("zero_bubble_h1", 4, 8), costs)
        assert timeline.utilization == pytest.approx(
            zero_bubble_h1_utilization(4, 8, costs["F"], costs["I"], costs["W"])
        )
    with pytest.raises(ValueError, match="t_w=2"):
        zero_bubble_h1_bubble_time(4, 1.0, 1.0, 2.0)
    with pytest.raises(ValueError, match="microbatches=2"):
        zero_bubble_h1_utilization(4, 2)


def test_in_flight_micro_batches_1f1b_at_most_p_gpipe_m() -> None:
    assert max_inflight_microbatches(build_plan("1f1b", 4, 8)) == {0: 4, 1: 3, 2: 2, 3: 1}
    assert max_inflight_microbatches(build_plan("gpipe", 4, 8)) == {0: 8, 1: 8, 2: 8, 3: 8}
    # ZB-H1 defers W's on later ranks, evening every rank out at 1F1B's peak.
    assert max_inflight_microbatches(build_plan("zero_bubble_h1", 4, 8)) == {r: 4 for r in range(4)}


def test_transfer_latency_delays_every_cross_rank_hop() -> None:
    free = replay(build_plan("naive", 4, 1), FULL)
    slow = replay(build_plan("naive", 4, 1), FULL, transfer=0.5)
    assert slow.makespan == free.makespan + 6 * 0.5  # three hops forward, three back
    one_rank = build_plan("interleaved_1f1b", 1, 2, 2)
    assert replay(one_rank, FULL, transfer=9.0).makespan == 12.0  # nothing crosses ranks


def test_costs_can_be_given_per_action_or_per_send() -> None:
    plan = build_plan("naive", 2, 1)
    durations = {Action(0, "F", 0): 3.0, "F": 1.0, "B": 2.0}
    sends = {Action(0, "SEND_F", 0): 0.25, Action(1, "SEND_B", 0): 0.75}
    timeline = replay(plan, durations, transfer=sends)
    spans = {str(span.action): (span.rank, span.start, span.end) for span in timeline.spans}
    assert spans == {
        "0F0": (0, 0.0, 3.0),
        "1F0": (1, 3.25, 4.25),
        "1B0": (1, 4.25, 6.25),
        "0B0": (0, 7.0, 9.0),
    }
    assert replay(plan, lambda a: 1.0).makespan == 4.0
    with pytest.raises(KeyError, match="no duration for 1B0"):
        replay(plan, {"F": 1.0})


def test_replay_skips_transfers_and_refuses_orders_that_cannot_finish() -> None:
    plan = build_plan("1f1b", 3, 4)
    with_comm = insert_communication(plan, 3)
    assert replay(with_comm, FULL).makespan == replay(plan, FULL).makespan
    plan[0] = [plan[0][-1], *plan[0][:-1]]  # a backward before any forward
    with pytest.raises(ValueError, match="wait forever"):
        replay(plan, FULL)


def test_utilization_bound_dispatches_by_schedule_name() -> None:
    assert utilization_bound("naive", 4, 1) == 0.25
    assert utilization_bound("1f1b", 4, 4) == pytest.approx(4 / 7)
    assert utilization_bound("interleaved_1f1b", 4, 8, 2) == pytest.approx(8 / 9.5)
    assert utilization_bound("zero_bubble_h1", 4, 4) == pytest.approx(12 / 15)
    with pytest.raises(ValueError, match="schedule='pipedream'"):
        utilization_bound("pipedream", 4, 4)
