"""Every schedule builds a plan that passes validation, in the shape its paper describes.

A failure here means a schedule would deadlock, skip or repeat work, or break a stage's
dependencies on some (stages, micro-batches, virtual stages) — or that a configuration a
schedule cannot take is accepted instead of refused with the offending key named.
"""

from __future__ import annotations

import pytest

from impls.pipeline.actions import Action
from impls.pipeline.replay import max_inflight_microbatches
from impls.pipeline.schedules import SCHEDULES, SPLIT_BACKWARD, build_plan, stage_ranks
from impls.pipeline.validate import validate

STAGES = (1, 2, 3, 4, 8)
MICROBATCHES = (1, 2, 4, 8, 16)


def _table() -> list[tuple[str, int, int, int]]:
    """Every (schedule, P, M, V) of the grid that the schedule accepts."""
    cases = []
    for name in SCHEDULES:
        for p in STAGES:
            for m in MICROBATCHES:
                if name == "naive" and m != 1:
                    continue
                if name == "interleaved_1f1b":
                    cases += [(name, p, m, v) for v in (2, 3) if m % p == 0]
                elif name in ("zero_bubble_h2", "zero_bubble_v"):  # they need M >= P
                    v = 2 if name == "zero_bubble_v" else 1
                    cases += [(name, p, m, v)] if m >= p else []
                else:
                    cases.append((name, p, m, 1))
    return cases


TABLE = _table()


def test_table_covers_every_schedule() -> None:
    assert {case[0] for case in TABLE} == set(SCHEDULES)
    # naive's five P; three full 5 x 5 grids; interleaved's 14 (P, M) with M % P == 0, times
    # V = 2, 3; ZB-H2's and ZB-V's 17 (P, M) with M >= P
    assert len(TABLE) == 5 + 3 * 25 + 2 * 14 + 2 * 17


@pytest.mark.parametrize(("name", "stages", "microbatches", "virtual_stages"), TABLE)
def test_every_schedule_passes_validation(
    name: str, stages: int, microbatches: int, virtual_stages: int
) -> None:
    plan = build_plan(name, stages, microbatches, virtual_stages)
    result = validate(
        plan, stages, microbatches, virtual_stages, stage_ranks(name, stages, virtual_stages)
    )
    per_stage = 3 if name in SPLIT_BACKWARD else 2  # F + B, or F + I + W
    assert len(result.placed) == stages * virtual_stages * microbatches * per_stage


def test_naive_is_forward_then_backward_on_each_rank() -> None:
    assert build_plan("naive", 3, 1) == {
        r: [Action(r, "F", 0), Action(r, "B", 0)] for r in range(3)
    }


def test_gpipe_runs_all_forwards_then_backwards_in_reverse_order() -> None:
    kinds = [(a.kind, a.microbatch) for a in build_plan("gpipe", 2, 3)[1]]
    assert kinds == [("F", 0), ("F", 1), ("F", 2), ("B", 2), ("B", 1), ("B", 0)]


def test_one_f_one_b_warms_up_with_p_minus_r_minus_1_forwards() -> None:
    plan = build_plan("1f1b", 4, 8)
    for rank, actions in plan.items():
        first_backward = next(i for i, a in enumerate(actions) if a.kind == "B")
        assert first_backward == (4 - rank - 1) + 1  # warm-up, then one steady-state forward
    assert [str(a) for a in plan[3][:4]] == ["3F0", "3B0", "3F1", "3B1"]


def test_interleaved_rank_owns_every_pth_stage() -> None:
    plan = build_plan("interleaved_1f1b", 4, 8, virtual_stages=3)
    for rank, actions in plan.items():
        assert {a.stage for a in actions} == {rank, rank + 4, rank + 8}


def test_zero_bubble_h1_splits_every_backward_and_defers_w_by_rank() -> None:
    plan = build_plan("zero_bubble_h1", 4, 8)
    for rank, actions in plan.items():
        assert {a.kind for a in actions} == {"F", "I", "W"}
        order = [str(a) for a in actions]
        # W(0) runs only after I(rank): each rank holds back `rank` weight gradients.
        assert order.index(f"{rank}W0") > order.index(f"{rank}I{rank}")


def test_one_f_one_b_and_zero_bubble_hold_at_most_p_micro_batches_gpipe_m() -> None:
    for p, m in [(4, 8), (4, 16), (8, 16), (3, 2)]:
        assert max_inflight_microbatches(build_plan("1f1b", p, m))[0] == min(p, m)
        assert max(max_inflight_microbatches(build_plan("1f1b", p, m)).values()) <= p
        assert max(max_inflight_microbatches(build_plan("zero_bubble_h1", p, m)).values()) <= p
        assert set(max_inflight_microbatches(build_plan("gpipe", p, m)).values()) == {m}


@pytest.mark.parametrize(
    ("args", "key", "rule"),
    [
        (("pipedream", 4, 4), "schedule='pipedream'", "naive, gpipe, 1f1b"),
        (("gpipe", 0, 4), "stages=0", ">= 1"),
        (("gpipe", 4, 0), "microbatches=0", ">= 1"),
        (("1f1b", 2.0, 4), "stages=2.0", "integer"),
        (("naive", 4, 4), "microbatches=4", "must be 1"),
        (("interleaved_1f1b", 4, 6, 2), "microbatches=6", "divisible by stages=4"),
        (("interleaved_1f1b", 4, 8, 1), "virtual_stages=1", ">= 2 for schedule 'interleaved_1f1b'"),
        (("zero_bubble_h1", 4, 8, 2), "virtual_stages=2", "must be 1"),
        (("zero_bubble_h2", 4, 8, 2), "virtual_stages=2", "must be 1"),
        (("zero_bubble_v", 4, 8, 1), "virtual_stages=1", "must be 2"),
        (("zero_bubble_v", 4, 8, 3), "virtual_stages=3", "must be 2"),
        (
            ("zero_bubble_h2", 4, 3),
            "microbatches=3",
            "'zero_bubble_h2' needs microbatches >= stages=4",
        ),
        (
            ("zero_bubble_v", 4, 2, 2),
            "microbatches=2",
            "'zero_bubble_v' needs microbatches >= stages=4",
        ),
    ],
)
def test_bad_configurations_are_refused_naming_the_key(args: tuple, key: str, rule: str) -> None:
    with pytest.raises(ValueError) as caught:
        build_plan(*args)
    assert key in str(caught.value) and rule in str(caught.value)


def test_schedule_functions_check_their_own_arguments() -> None:
    with pytest.raises(ValueError, match="microbatches=3"):
        SCHEDULES["naive"].build(2, 3)
    with pytest.raises(ValueError, match="microbatches=3"):
        SCHEDULES["interleaved_1f1b"].build(2, 3, 2)


def test_zero_bubble_h2_holds_2p_minus_1_and_keeps_weight_gradients_for_the_drain() -> None:
    for p, m in [(2, 4), (4, 8), (4, 16), (8, 16)]:
        plan = build_plan("zero_bubble_h2", p, m)
        assert max_inflight_microbatches(plan) == {r: min(2 * p - 1, m) for r in range(p)}
        for rank, actions in plan.items():
            last_i = max(i for i, a in enumerate(actions) if a.kind == "I")
            # its own last W, and the 2r it kept back
            assert [a.kind for a in actions[last_i + 1 :]] == ["W"] * (2 * rank + 1)


def test_zero_bubble_v_places_stages_r_and_2p_minus_1_minus_r_on_rank_r() -> None:
    p = 4
    assert stage_ranks("zero_bubble_v", p, 2) == (0, 1, 2, 3, 3, 2, 1, 0)
    assert stage_ranks("interleaved_1f1b", p, 2) is None  # round-robin
    plan = build_plan("zero_bubble_v", p, 8, 2)
    for rank, actions in plan.items():
        assert {a.stage for a in actions} == {rank, 2 * p - 1 - rank}
    # The default placement refuses it: round-robin puts stage 7 on rank 3, not rank 0.
    with pytest.raises(ValueError, match="7F0 belongs on rank 3, not rank 0"):
        validate(plan, p, 8, 2)


def test_zero_bubble_v_warms_up_in_a_v_then_runs_f_i_w_at_1f1b_memory() -> None:
    """Rank r: 2P−1−2r forwards down its first chunk, then micro-batch 0 comes back up its
    second; 2P chunk pairs held at most (1F1B's P micro-batches); no W before the first I
    (the replay tests pin that no rank idles)."""
    for p, m in [(2, 4), (4, 8), (4, 16), (8, 16)]:
        plan = build_plan("zero_bubble_v", p, m, 2)
        assert max_inflight_microbatches(plan) == {r: 2 * p for r in range(p)}
        for rank, actions in plan.items():
            warm = 2 * p - 1 - 2 * rank
            assert actions[:warm] == [Action(rank, "F", i) for i in range(warm)]
            assert actions[warm] == Action(2 * p - 1 - rank, "F", 0)
            first_i = next(i for i, a in enumerate(actions) if a.kind == "I")
            assert {a.kind for a in actions[:first_i]} == {"F"}
            assert actions[first_i + 1].kind == "W"  # the steady state's F, I, W begins
