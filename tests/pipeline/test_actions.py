"""Actions print as `1F0` and parse back; plans survive a CSV round trip.

A failure here means a plan written by one tool (a schedule, the dry run, torchtitan's or
torch.distributed.pipelining's CSV reader) would be read differently by another: the
executor could run an action nobody scheduled.
"""

from __future__ import annotations

import pytest

from impls.pipeline.actions import KINDS, Action, plan_from_csv, plan_to_csv
from impls.pipeline.schedules import build_plan
from impls.pipeline.validate import insert_communication


def test_format_is_stage_kind_microbatch() -> None:
    assert str(Action(1, "F", 0)) == "1F0"
    assert str(Action(12, "SEND_B", 34)) == "12SEND_B34"
    assert str(Action(0, "W", 7)) == "0W7"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("stage", "microbatch"), [(0, 0), (3, 11), (17, 250)])
def test_parse_round_trips_every_kind(kind: str, stage: int, microbatch: int) -> None:
    action = Action(stage, kind, microbatch)
    assert Action.parse(str(action)) == action


def test_parse_reads_multi_digit_numbers_around_a_kind() -> None:
    # The kind separates the two numbers, so "10F11" cannot be read as stage 1.
    assert Action.parse("10F11") == Action(10, "F", 11)
    assert Action.parse(" 2RECV_F3 ") == Action(2, "RECV_F", 3)


@pytest.mark.parametrize("text", ["", "F0", "1F", "1X0", "1SEND0", "-1F0", "1f0", "1F0F1", "1FB0"])
def test_parse_rejects_malformed_text(text: str) -> None:
    with pytest.raises(ValueError, match="cannot parse action"):
        Action.parse(text)


def test_action_rejects_unknown_kind_and_negative_numbers() -> None:
    with pytest.raises(ValueError, match="kind 'X'"):
        Action(0, "X", 0)
    with pytest.raises(ValueError, match="stage"):
        Action(-1, "F", 0)
    with pytest.raises(ValueError, match="microbatch"):
        Action(0, "F", True)


def test_compute_and_comm_kinds_are_told_apart() -> None:
    assert Action(0, "I", 0).is_compute and not Action(0, "I", 0).is_comm
    assert Action(0, "SEND_F", 0).is_comm and not Action(0, "SEND_F", 0).is_compute


def test_csv_has_one_row_per_rank_in_the_pipelining_form(tmp_path) -> None:
    path = tmp_path / "plan.csv"
    plan_to_csv(build_plan("gpipe", stages=2, microbatches=2), path)
    assert path.read_text().splitlines() == ["0F0,0F1,0B1,0B0", "1F0,1F1,1B1,1B0"]


@pytest.mark.parametrize(
    ("name", "stages", "microbatches", "virtual_stages"),
    [
        ("naive", 3, 1, 1),
        ("1f1b", 4, 8, 1),
        ("interleaved_1f1b", 2, 4, 3),
        ("zero_bubble_h1", 3, 5, 1),
    ],
)
def test_csv_round_trips_plans_with_and_without_transfers(
    tmp_path, name: str, stages: int, microbatches: int, virtual_stages: int
) -> None:
    plan = build_plan(name, stages, microbatches, virtual_stages)
    for version in (plan, insert_communication(plan, stages, virtual_stages)):
        path = tmp_path / f"{name}.csv"
        plan_to_csv(version, path)
        assert plan_from_csv(path) == version


def test_csv_reader_skips_idle_cells_and_keeps_empty_ranks(tmp_path) -> None:
    path = tmp_path / "idle.csv"
    path.write_text("0F0,,0B0\n\n")
    assert plan_from_csv(path) == {0: [Action(0, "F", 0), Action(0, "B", 0)], 1: []}


def test_csv_writer_refuses_ranks_with_gaps(tmp_path) -> None:
    with pytest.raises(ValueError, match="ranks must be 0..1"):
        plan_to_csv({0: [], 2: []}, tmp_path / "gap.csv")


def test_torch_pipelining_reads_our_csv_cells_as_the_same_actions(tmp_path) -> None:
    # torch's own parser (private, so this pins the format against the installed torch).
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    plan = build_plan("zero_bubble_h1", 2, 3)
    path = tmp_path / "zb.csv"
    plan_to_csv(insert_communication(plan, 2), path)
    for row in path.read_text().splitlines():
        for cell in row.split(","):
            ours, theirs = Action.parse(cell), schedules._Action.from_str(cell)
            assert (theirs.stage_index, theirs.computation_type.value, theirs.microbatch_index) == (
                ours.stage,
                ours.kind,
                ours.microbatch,
            )
            assert str(theirs) == str(ours)
