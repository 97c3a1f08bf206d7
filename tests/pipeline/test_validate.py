"""The dry run accepts good plans and catches broken ones, showing where on the step grid.

A failure here means a plan that would deadlock, skip a backward, run work twice or read
a tensor before it exists could reach the executor unnoticed (where it hangs or silently
computes wrong gradients), or that the error no longer points at the faulty cell.
"""

from __future__ import annotations

import re

import pytest

from impls.pipeline.actions import Action, Plan
from impls.pipeline.schedules import build_plan
from impls.pipeline.validate import PlanError, dry_run, insert_communication, validate


def _plan(rows: dict[int, str]) -> Plan:
    return {rank: [Action.parse(a) for a in row.split()] for rank, row in rows.items()}


def _marked(grid: str) -> list[str]:
    """The contents of every `[x]*` cell, leaving out the legend on the last line."""
    return re.findall(r"\[([^\]]+)\]\*", grid.rsplit("\n", 1)[0])


def _failure(plan: Plan, stages: int, microbatches: int, virtual_stages: int = 1) -> PlanError:
    with pytest.raises(PlanError) as caught:
        validate(plan, stages, microbatches, virtual_stages)
    assert caught.value.grid and caught.value.grid in str(caught.value)
    return caught.value


def test_passing_plan_has_a_grid_of_every_step() -> None:
    result = validate(build_plan("1f1b", 3, 4), 3, 4)
    lines = result.grid().splitlines()
    assert [cell.strip() for cell in lines[0].split("|")] == ["step", "rank 0", "rank 1", "rank 2"]
    assert len(lines) == result.steps + 3  # header, rule, steps, legend
    assert not _marked(result.grid())


def test_transfers_surround_exactly_the_cross_rank_dependencies() -> None:
    with_comm = insert_communication(build_plan("1f1b", 2, 2), stages=2)
    assert [str(a) for a in with_comm[1] if a.is_comm] == [
        "1RECV_F0",
        "1RECV_F1",
        "1SEND_B0",
        "1SEND_B1",
    ]
    for actions in with_comm.values():
        for i, action in enumerate(actions):
            if action.kind == "F" and action.stage == 1:
                assert Action(1, "RECV_F", action.microbatch) in actions[:i]
            if action.kind == "B" and action.stage == 0:
                assert Action(0, "RECV_B", action.microbatch) in actions[:i]
    one_rank = build_plan("interleaved_1f1b", 1, 2, 3)
    assert insert_communication(one_rank, stages=1, virtual_stages=3) == one_rank


def test_swapped_actions_deadlock_and_both_stuck_rounds_are_marked() -> None:
    plan = build_plan("1f1b", 2, 2)  # rank 0: 0F0 0F1 0B0 0B1
    plan[0] = _plan({0: "0F0 0B1 0B0 0F1"})[0]  # 0B1 now waits on its own later 0F1
    error = _failure(plan, 2, 2)
    assert error.problem.startswith("deadlock")
    assert "rank 0's 0RECV_B1 waits for 1SEND_B1 on rank 1" in error.problem
    stuck = next(line for line in error.grid.splitlines() if line.startswith("stuck"))
    assert "[0SEND_F0+0RECV_B1]*" in stuck and "RECV_F1" in stuck


def test_dropped_middle_backward_starves_the_rank_before_it() -> None:
    plan = build_plan("1f1b", 3, 2)
    plan[1].remove(Action(1, "B", 0))
    error = _failure(plan, 3, 2)
    assert "rank 0's 0RECV_B0 waits for 1SEND_B0 on rank 1" in error.problem
    assert any("0RECV_B0" in cell for cell in _marked(error.grid))


def test_dropped_first_stage_backward_is_reported_at_its_forward() -> None:
    plan = build_plan("gpipe", 2, 3)
    plan[0].remove(Action(0, "B", 1))
    error = _failure(plan, 2, 3)
    assert "forwards without a complete backward" in error.problem and "0F1" in error.problem
    assert _marked(error.grid) == ["0F1"]


def test_duplicated_forward_is_marked_where_it_runs_again() -> None:
    plan = build_plan("1f1b", 2, 2)
    plan[0].insert(2, Action(0, "F", 0))
    error = _failure(plan, 2, 2)
    assert "duplicate 0F0: it already ran at step 0" in error.problem
    assert _marked(error.grid) == ["0F0"]


@pytest.mark.parametrize(
    ("rows", "problem", "cell"),
    [
        ({0: "0F0 0W0 0I0"}, "0W0 runs before 0I0", "0W0"),
        ({0: "0F0 0I0 0B0 0W0"}, "mixes a full backward", "0B0"),
        ({0: "0B0 0F0"}, "needs stage 0's activation", "0B0"),
    ],
)
def test_backward_order_faults_on_one_rank(rows: dict[int, str], problem: str, cell: str) -> None:
    error = _failure(_plan(rows), 1, 1)
    assert problem in error.problem and _marked(error.grid) == [cell]


@pytest.mark.parametrize(
    ("rows", "problem", "cell"),
    [
        ({0: "0F0 1F0 1B0 0B0", 1: ""}, "position 1: 1F0 belongs on rank 1, not rank 0", "1F0"),
        ({0: "0F0 0B0", 1: "1F0 3F0"}, "3F0: stage 3 does not exist", "3F0"),
        ({0: "0RECV_F0", 1: ""}, "0RECV_F0 has no partner: stage -1", "0RECV_F0"),
    ],
)
def test_misplaced_actions_are_refused_on_the_plan_grid(
    rows: dict[int, str], problem: str, cell: str
) -> None:
    with pytest.raises(PlanError) as caught:
        dry_run(_plan(rows), stages=2, virtual_stages=1)
    assert problem in caught.value.problem and _marked(caught.value.grid) == [cell]
    assert caught.value.grid.startswith("index")


def test_adjacent_transfers_deadlock_interleaved_under_rendezvous_but_not_buffered() -> None:
    plan = build_plan("interleaved_1f1b", 2, 4, 2)
    adjacent = insert_communication(plan, 2, 2, placement="adjacent")
    with pytest.raises(PlanError, match="deadlock") as caught:
        dry_run(adjacent, 2, 2)
    assert "stuck" in caught.value.grid and _marked(caught.value.grid)
    dry_run(adjacent, 2, 2, sends="buffered")
    dry_run(insert_communication(plan, 2, 2), 2, 2)  # the default, paired placement


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zero_bubble_h1"])
def test_adjacent_transfers_pass_with_buffered_sends(name: str) -> None:
    plan = build_plan(name, 4, 8)
    dry_run(insert_communication(plan, 4, placement="adjacent"), 4, sends="buffered")


def test_unreceived_send_is_caught_in_both_send_modes() -> None:
    plan = _plan({0: "0F0 0SEND_F0", 1: ""})
    with pytest.raises(PlanError, match="sent but never received") as caught:
        dry_run(plan, sends="buffered")
    assert _marked(caught.value.grid) == ["0SEND_F0"]
    with pytest.raises(PlanError, match="0SEND_F0 waits for 1RECV_F0 on rank 1"):
        dry_run(plan)


def test_messages_received_out_of_order_are_refused() -> None:
    plan = _plan(
        {
            0: "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B1 0B1 0RECV_B0 0B0",
            1: "1RECV_F1 1RECV_F0 1F0 1F1 1B1 1SEND_B1 1B0 1SEND_B0",
        }
    )
    with pytest.raises(PlanError, match="expects stage 0's activation of micro-batch 1") as caught:
        dry_run(plan)
    assert len(_marked(caught.value.grid)) == 2


def test_validate_checks_the_micro_batch_count() -> None:
    plan = build_plan("gpipe", 2, 2)
    assert "2 forwards never run: 0F2, 1F2" in _failure(plan, 2, 3).problem
    error = _failure(plan, 2, 1)
    assert "names micro-batch 1, but microbatches=1" in error.problem
    assert len(_marked(error.grid)) == 1


def test_malformed_inputs_are_refused_before_simulating() -> None:
    plan = build_plan("gpipe", 2, 2)
    with pytest.raises(PlanError, match="already has communication"):
        insert_communication(insert_communication(plan, 2), 2)
    with pytest.raises(PlanError, match=r"expected 0..2 \(stages=3\)"):
        validate(plan, 3, 2)
    with pytest.raises(PlanError, match="1F0 belongs on rank 1"):
        validate(_plan({0: "0F0 1F0 1B0 0B0", 1: ""}), 2, 1)
    with pytest.raises(ValueError, match="placement='eager'"):
        insert_communication(plan, 2, placement="eager")
    with pytest.raises(ValueError, match="sends='async'"):
        dry_run(insert_communication(plan, 2), sends="async")


def test_long_grids_keep_the_marked_rows_and_elide_the_rest() -> None:
    plan = build_plan("1f1b", 8, 16)
    plan[0].remove(Action(0, "B", 15))
    error = _failure(plan, 8, 16)
    assert _marked(error.grid) == ["0F15"]
    assert "..." in error.grid.splitlines()
    assert len(error.grid.splitlines()) < 48
