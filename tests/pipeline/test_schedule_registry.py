"""Every registered schedule declares every piece its consumers read.

A failure means a spec in `impls.pipeline.schedules.SCHEDULES` lacks a piece (a label, a
bubble bound, an in-flight count, a marker) or declares one that does not hold for its
own plans: the report would print a raw name, the theory column would be missing, or the
planner's memory bound would count the wrong micro-batches.
"""

from __future__ import annotations

import pytest
from matplotlib.markers import MarkerStyle

from impls.pipeline.replay import max_inflight_microbatches, replay
from impls.pipeline.schedules import COUNTED_ON_PLAN, SCHEDULES, ScheduleSpec, stage_ranks
from impls.pipeline.schedules.spec import CHUNKS
from impls.pipeline.validate import PlanError, dry_run, insert_communication
from tests.literal_names import literal_name_lists

# (P, M) every schedule's bound holds for (zero bubble: M ≥ P, ZB-H2: M ≥ 2P − 1)
SHAPES = ((2, 4), (4, 8))


def _chunks(spec: ScheduleSpec) -> int:
    return 1 if spec.chunks == "one" else 2


def _microbatches(spec: ScheduleSpec, m: int) -> int:
    return m if spec.microbatched else 1


def missing_pieces(spec: ScheduleSpec) -> list[str]:
    """What `spec` lacks or gets wrong; empty when every consumer can read it."""
    missing = []
    if not spec.label:
        missing.append("label (empty: the report would print the raw name)")
    formula, _, source = (spec.bound_source or "").partition(" — ")
    if not formula.strip() or not source.strip():
        missing.append("bound_source ('formula — paper, section')")
    if spec.marker not in MarkerStyle.markers or spec.marker in (None, "", "None", " "):
        missing.append(f"marker ({spec.marker!r} is not a matplotlib marker)")
    if spec.chunks not in CHUNKS:
        missing.append(f"chunks ({spec.chunks!r} not in {CHUNKS})")
    if not callable(spec.build) or not callable(spec.utilization):
        return [*missing, "build or utilization (not callable)"]
    if spec.inflight != COUNTED_ON_PLAN and not callable(spec.inflight):
        return [*missing, "inflight (neither a function nor COUNTED_ON_PLAN)"]
    for p, m in SHAPES:
        m, v = _microbatches(spec, m), _chunks(spec)
        plan = spec.plan(p, m, v)
        ranks = stage_ranks(spec.name, p, v)
        try:
            full = insert_communication(plan, p, v, stage_ranks=ranks)
            dry_run(full, p, v, stage_ranks=ranks)
        except PlanError as error:
            missing.append(f"build (P={p}, M={m}: {error})")
            continue
        bound = spec.utilization(p, m, v)
        durations = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
        measured = replay(plan, durations, num_stages=p * v, stage_ranks=ranks).utilization
        if not 0 < bound <= 1 or measured > bound + 1e-9:
            missing.append(f"utilization (P={p}, M={m}: bound {bound}, replayed {measured})")
        counted = max_inflight_microbatches(plan)
        if spec.held(p, m, v) != [counted[r] for r in range(p)]:
            missing.append(
                f"inflight (P={p}, M={m}: declares {spec.held(p, m, v)}, the "
                f"plan holds {[counted[r] for r in range(p)]})"
            )
    if spec.planner and spec.chunks == "v_shape":
        missing.append("planner (a ParallelPlan cannot place chunks in a V)")
    return missing


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_schedule_declares_every_piece(name: str) -> None:
    spec = SCHEDULES[name]
    assert spec.name == name, f"registered as {name!r}, named {spec.name!r}"
    assert missing_pieces(spec) == []


def test_labels_and_markers_tell_the_schedules_apart() -> None:
    labels = [s.label for s in SCHEDULES.values()]
    markers = [s.marker for s in SCHEDULES.values()]
    assert len(set(labels)) == len(labels), labels
    assert len(set(markers)) == len(markers), markers


@pytest.mark.parametrize(
    ("change", "piece"),
    [
        ({"label": ""}, "label"),
        ({"bound_source": "M/(M+P−1)"}, "bound_source"),
        ({"marker": "not a marker"}, "marker"),
        ({"utilization": lambda p, m, v: 1.0 / p}, "utilization"),  # below what it replays
        ({"inflight": lambda p, m, v: [1] * p}, "inflight"),
        ({"planner": True, "chunks": "v_shape"}, "planner"),
    ],
)
def test_a_spec_missing_a_piece_is_caught(change: dict, piece: str) -> None:
    """The check above is not vacuous: break one piece of GPipe's spec and it names it."""
    from dataclasses import replace

    broken = replace(SCHEDULES["gpipe"], **change)
    if piece == "planner":  # a V needs the V-shaped builder to build at all
        broken = replace(SCHEDULES["zero_bubble_v"], planner=True)
    assert any(m.startswith(piece) for m in missing_pieces(broken)), missing_pieces(broken)


# Lists that name schedules for a reason of their own, not as "every schedule" (the
# report files are being rewritten elsewhere; an entry that disappears is not an error).
NAMED_FOR_A_REASON = {
    # the schedules torch.distributed.pipelining also has, timed against distbench's
    ("bench/experiments/pipeline_utilization/report.py", ("gpipe", "1f1b", "interleaved_1f1b")),
    # the two schedules whose traced timeline the report draws
    ("bench/experiments/pipeline_utilization/schedules_report.py", ("naive", "gpipe")),
}


def test_no_literal_list_of_schedule_names_outside_the_registry() -> None:
    """A list of schedule names in bench/ or impls/ goes stale when a schedule is added:
    read it off `SCHEDULES` (its flags: chunks, microbatched, split_backward, planner)."""
    found = literal_name_lists(SCHEDULES, skip=("impls/pipeline/schedules/",))
    assert [hit for hit in found if hit not in NAMED_FOR_A_REASON] == []


def test_the_literal_list_check_is_not_vacuous(tmp_path, monkeypatch) -> None:
    import tests.literal_names as literal_names

    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "config.py").write_text('ALLOWED = ("1f1b", "gpipe", "other")\n')
    monkeypatch.setattr(literal_names, "ROOT", tmp_path)
    assert literal_names.literal_name_lists(SCHEDULES) == [
        ("bench/config.py", ("1f1b", "gpipe", "other"))
    ]
