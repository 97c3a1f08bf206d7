"""Experiment `pipeline_utilization`: its config, its grid, its rows, and one small run.

A failure here means a pipeline grid that cannot work would start ranks (or fail minutes
in) instead of being refused naming the key; a grid that silently runs a combination a
schedule cannot take, or drops one it can; a results row whose utilization is not what
its records say, or whose gradients are not checked against one process's; or the command line no longer producing results, traces and a report.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

from bench.experiments import experiments
from bench.experiments.pipeline_utilization import slicing as pu_slicing
from bench.experiments.pipeline_utilization.experiment import (
    EXPERIMENT,
    PipelineUtilizationConfig,
    cells,
    to_row,
)
from bench.experiments.pipeline_utilization.names import slicing_of
from bench.experiments.pipeline_utilization.slicing import (
    LayerCosts,
    alpa_layers,
    equal_layers,
    predicted_step_s,
)
from impls.pipeline import build_plan
from impls.pipeline.executor import ActionRecord

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = {"d_model": 32, "n_layers": 4, "n_heads": 2, "seq_len": 8, "vocab_size": 16}


def test_registered_under_its_name():
    assert experiments()["pipeline_utilization"] is EXPERIMENT


def test_default_grid_leaves_out_what_a_schedule_cannot_take():
    cfg = PipelineUtilizationConfig()
    by_schedule: dict[str, set] = {}
    for cell in cells(cfg):
        schedule, p, m, v, cut = cell.key.values()
        assert cut == "equal"  # the default grid runs the equal split only
        by_schedule.setdefault(schedule, set()).add((p, m))
        chunks = 2 if schedule == "zero_bubble_v" else 1  # ZB-V: always two, in a V
        assert v == (cfg.virtual_stages if "interleaved" in schedule else chunks)
        # The plan is built once, here, and carried to the ranks and the row.
        if schedule.startswith("torch_"):
            assert cell.carry.plan is None and cell.carry.torch_schedule
        else:
            assert cell.carry.plan == build_plan(schedule, p, m, v)
    ms = cfg.microbatches
    assert by_schedule["naive"] == {(p, 1) for p in cfg.stages}
    for name in ("interleaved_1f1b", "torch_interleaved_1f1b"):
        assert by_schedule[name] == {(p, m) for p in cfg.stages for m in ms if m % p == 0}
    for name in ("torch_1f1b", "zero_bubble_h2", "zero_bubble_v"):
        assert by_schedule[name] == {(p, m) for p in cfg.stages for m in ms if m >= p}
    for name in ("gpipe", "1f1b", "zero_bubble_h1", "torch_gpipe"):
        assert by_schedule[name] == {(p, m) for p in cfg.stages for m in ms}
    # One rank per stage, and the runner's one-pool-per-world-size needs P ascending.
    sizes = [c.world_size for c in cells(cfg)]
    assert sizes == sorted(sizes)
    assert all(c.world_size == c.key["stages"] for c in cells(cfg))


def test_profiling_gives_every_action_kind_its_samples_in_at_least_two_steps():
    cfg = PipelineUtilizationConfig(profile_samples=12)
    assert [cfg.profiling_steps(m) for m in (1, 4, 5, 8, 32)] == [12, 3, 3, 2, 2]
    assert PipelineUtilizationConfig(profile_samples=1).profiling_steps(1) == 2


def test_scalars_are_accepted_as_one_element_grids():
    cfg = PipelineUtilizationConfig(schedules="gpipe", stages=2, microbatches=4)
    assert (cfg.schedules, cfg.stages, cfg.microbatches) == (["gpipe"], [2], [4])


def test_only_the_chosen_micro_batch_counts_are_traced(tmp_path):
    cfg = PipelineUtilizationConfig(
        schedules=["gpipe", "torch_gpipe"],
        stages=[2],
        microbatches=[1, 2, 4],
        trace_microbatches=[4],
        trace_dir=str(tmp_path),
    )
    traced = {(c.key["schedule"], c.key["microbatches"]) for c in cells(cfg) if c.carry.trace}
    assert traced == {("gpipe", 4)}  # torch's schedule records no per-action timeline


def test_only_schedules_torch_has_are_paired_with_it():
    cfg = PipelineUtilizationConfig(stages=[4], microbatches=[1, 4])
    paired = {
        (c.key["schedule"], c.key["microbatches"])
        for c in cells(cfg)
        if c.carry.plan is not None and c.carry.torch_schedule
    }
    # torch's Schedule1F1B needs M ≥ P; naive and ZB-H1 have no torch twin here.
    assert paired == {("gpipe", 1), ("gpipe", 4), ("1f1b", 4), ("interleaved_1f1b", 4)}
    unpaired = cells(PipelineUtilizationConfig(paired=False))
    assert not any(c.carry.plan is not None and c.carry.torch_schedule for c in unpaired)


# (overrides, text the error must contain): each on an otherwise valid config.
REFUSALS = [
    ({"schedules": ["gpipe", "pipedream"]}, ["schedules", "pipedream", "allowed values", "1f1b"]),
    ({"stages": [2, 8], "n_layers": 4}, ["stages=[2, 8]", "n_layers=4", "at least one layer"]),
    ({"schedules": ["gpipe"], "stages": [8], "n_layers": 4}, ["stages=[8]", "n_layers=4"]),
    ({"schedules": ["naive"], "microbatches": [2, 4]}, ["microbatches=[2, 4]", "'naive'"]),
    (
        {
            "schedules": ["interleaved_1f1b"],
            "stages": [4],
            "microbatches": [2, 6],
            "batch_size": 12,
        },
        ["microbatches=[2, 6]", "interleaved_1f1b", "divisible by stages=4"],
    ),
    ({"schedules": ["torch_1f1b"], "stages": [4], "microbatches": [2]}, ["torch", "microbatches"]),
    ({"microbatches": [1, 3]}, ["microbatches=[3]", "batch_size=32"]),
    ({"microbatches": [0, 2]}, ["microbatches=[0, 2]", "≥ 1"]),
    ({"stages": [0]}, ["stages=[0]"]),
    ({"virtual_stages": 1}, ["virtual_stages=1", "≥ 2", "interleaved"]),
    ({"n_heads": 3}, ["n_heads=3", "d_model=128"]),
    ({"batch_size": 0}, ["batch_size=0"]),
    ({"repeats": 0}, ["repeats=0"]),
    ({"timeout_s": 0}, ["timeout_s"]),
    ({"slicings": ["bogus"]}, ["slicings=['bogus']", "equal, alpa"]),
    ({"slicing_pairs": [{"schedule": "gpipe", "stages": 4}]}, ["slicing_pairs", "microbatches"]),
    (
        {"slicing_pairs": [{"schedule": "interleaved_1f1b", "stages": 2, "microbatches": 4}]},
        ["slicing_pairs", "one stage per rank"],
    ),
    (
        {"slicing_pairs": [{"schedule": "torch_gpipe", "stages": 2, "microbatches": 4}]},
        ["slicing_pairs", "distbench's"],
    ),
    (
        {"slicing_pairs": [{"schedule": "gpipe", "stages": 2, "microbatches": 3}]},
        ["slicing_pairs", "batch_size=32"],
    ),
]


@pytest.mark.parametrize("overrides, needles", REFUSALS, ids=[str(o) for o, _ in REFUSALS])
def test_config_that_cannot_work_is_refused_naming_the_key(overrides, needles):
    with pytest.raises(ValueError) as refused:
        EXPERIMENT.parse(overrides)
    for needle in needles:
        assert needle in str(refused.value), (needle, str(refused.value))


def test_unknown_key_is_refused():
    with pytest.raises(ValueError, match="unknown key.*steps.*allowed keys"):
        EXPERIMENT.parse({"steps": 3})


def _records(plan, rank: int, cost: dict[str, float]) -> list[ActionRecord]:
    """Compute records with the given CPU cost per kind (wall spans laid end to end)."""
    out, clock = [], 0.0
    for action in plan[rank]:
        seconds = cost[action.kind]
        out.append(ActionRecord(str(action), action.kind, clock, clock + seconds, seconds))
        clock += seconds
    return out


def _gpipe_2x2(tmp_path: Path, **overrides) -> tuple:
    """A traced, paired GPipe P=2, M=2 cell and its ranks' results: F = 1, B = 2 in the
    isolated profiling steps, rank 1's B slowed to 4 by a neighbour inside the timed ones."""
    cfg = PipelineUtilizationConfig(
        schedules=["gpipe"],
        stages=[2],
        microbatches=[2],
        repeats=2,
        batch_size=4,
        trace_microbatches=[2],
        **TINY,
        **overrides,
    )
    (cell,) = cells(cfg)
    plan = build_plan("gpipe", 2, 2)
    per_rank = [
        {
            "rank": r,
            "step_times_s": [0.5, 0.7],
            "torch_step_times_s": [0.4, 0.6],
            "loss": 2.5 if r == 1 else None,
            "records": [_records(plan, r, {"F": 1.0, "B": 2.0 + 2.0 * r})] * 2,
            "isolated_records": [_records(plan, r, {"F": 1.0, "B": 2.0})] * 2,
            "peak_activation_bytes": 1000 * (r + 1),
            "max_inflight": 2,
            "transfer_s": 0.0,
            "reference_loss": 2.5,
            "grad_error": 1e-7,
        }
        for r in range(2)
    ]
    return cfg, cell, per_rank


def test_row_replays_the_records_it_is_given(tmp_path):
    """GPipe P=2, M=2 with F = 1, B = 2 (the isolated profiling steps) and free transfers
    replays to M/(M+P−1) = 2/3; the in-step records (rank 1 slowed down by a neighbour)
    only feed `util_replayed_raw`. The row writes no file; `artefacts` writes the trace and
    spans (by default under the report_dir the runner passes)."""
    cfg, cell, per_rank = _gpipe_2x2(tmp_path)
    assert to_row(cfg, cell, per_rank)["trace_file"] == ""
    assert not any(tmp_path.iterdir()), "to_row must not write files"
    row = EXPERIMENT.row(cfg, cell, per_rank, tmp_path)
    assert row["util_replayed"] == pytest.approx(2 / 3)
    assert row["util_replayed_raw"] == pytest.approx(16 / 26)  # busy 6 + 10 over 2 × 13
    assert row["util_theory"] == pytest.approx(2 / 3)
    assert row["bubble_fraction"] == pytest.approx(1 / 3)
    assert row["step_time_s"] == pytest.approx(0.6)
    assert cell.carry.torch_schedule == "ScheduleGPipe"  # torch's twin is timed in this cell
    assert row["step_time_vs_torch"] == pytest.approx(0.6 / 0.5)
    assert row["loss"] == 2.5
    assert row["peak_activation_bytes"] == 2000
    assert row["max_inflight_microbatches"] == row["max_inflight_plan"] == 2
    assert (row["wrong"], row["grad_error"], row["reference_loss"]) == (0, 1e-7, 2.5)
    assert row["trace_file"] == "traces/gpipe_p2_m2.json"
    spans = pd.read_csv(tmp_path / row["spans_file"])
    assert set(spans["timeline"]) == {"replayed", "wall"}
    assert len(spans[spans["timeline"] == "replayed"]) == 2 * 2 * 2  # ranks × M × (F, B)
    assert (tmp_path / row["trace_file"]).stat().st_size > 0


def test_trace_dir_overrides_the_report_dir(tmp_path):
    cfg, cell, per_rank = _gpipe_2x2(tmp_path, trace_dir=str(tmp_path / "elsewhere"))
    row = EXPERIMENT.row(cfg, cell, per_rank, tmp_path / "report")
    assert (tmp_path / "elsewhere" / row["spans_file"]).exists()
    assert not (tmp_path / "report").exists()


def test_a_gradient_or_loss_off_the_reference_is_wrong(tmp_path):
    cfg, cell, per_rank = _gpipe_2x2(tmp_path)
    per_rank[0]["grad_error"] = 0.01  # e.g. a micro-batch's gradient counted twice
    per_rank[1]["grad_error"] = math.nan
    assert to_row(cfg, cell, per_rank)["wrong"] == 2
    assert math.isnan(to_row(cfg, cell, per_rank)["grad_error"])
    cfg, cell, per_rank = _gpipe_2x2(tmp_path)
    per_rank[1]["loss"] = 2.51
    assert to_row(cfg, cell, per_rank)["wrong"] == 1


def test_torch_row_leaves_what_it_cannot_observe_empty():
    cfg = PipelineUtilizationConfig(
        schedules=["torch_gpipe"], stages=[2], microbatches=[2], batch_size=4, **TINY
    )
    (cell,) = cells(cfg)
    per_rank = [
        {
            "rank": r,
            "step_times_s": [0.3],
            "loss": 2.0 if r else None,
            "reference_loss": 2.0,
            "grad_error": 0.0,
        }
        for r in (0, 1)
    ]
    row = to_row(cfg, cell, per_rank)
    assert row["impl"] == "torch" and row["step_time_s"] == 0.3 and row["loss"] == 2.0
    assert row["wrong"] == 0
    for column in ("util_wall", "util_replayed", "util_theory", "peak_activation_bytes"):
        assert math.isnan(row[column]), column
    assert EXPERIMENT.artefacts(cfg, cell, per_rank, Path("/nonexistent")) == {}


def _run_bench(tmp: Path, overrides: list[str], timeout: float) -> tuple[int | None, str]:
    command = [sys.executable, "-m", "bench", "experiment=pipeline_utilization", *overrides]
    command += [
        f"report_dir={tmp / 'report'}",
        f"hydra.run.dir={tmp / 'hydra'}",
        "wandb.mode=disabled",
    ]
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "0"}
    try:
        done = subprocess.run(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as expired:
        return None, f"still running after {timeout} s:\n{expired.output or ''}"
    return done.returncode, done.stdout


# Through the command line: refused before any rank starts (no results.csv, no progress bar).
CLI_REFUSALS = [
    (["stages=[2,8]", "n_layers=4"], ["bad config", "stages=[2, 8]", "n_layers=4"]),
    (
        ["schedules=[interleaved_1f1b]", "stages=4", "microbatches=[2,6]", "batch_size=12"],
        ["bad config", "microbatches=[2, 6]", "divisible by stages=4"],
    ),
]


def test_command_line_refuses_before_any_rank_starts(tmp_path):
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(
            pool.map(
                lambda i: _run_bench(tmp_path / str(i), CLI_REFUSALS[i][0], timeout=60),
                range(len(CLI_REFUSALS)),
            )
        )
    for i, ((code, output), (_, needles)) in enumerate(zip(outcomes, CLI_REFUSALS, strict=True)):
        assert code not in (0, None), output
        for needle in needles:
            assert needle in output, (needle, output)
        assert not (tmp_path / str(i) / "report" / "results.csv").exists()
        assert "cell/s" not in output


@pytest.mark.slow
def test_small_run_end_to_end(tmp_path):
    """`python -m bench experiment=pipeline_utilization` on a tiny GPT, P = 2: rows for
    distbench (ZB-V's V placement included) and torch, traces, plots, a headline; and one loss for every row (same
    weights, same batch), distbench's and torch's alike."""
    overrides = [
        "schedules=[naive,gpipe,1f1b,zero_bubble_v,torch_gpipe,torch_1f1b]",
        "stages=[2]",
        "microbatches=[1,2]",
        "batch_size=4",
        "repeats=1",
        "trace_microbatches=[1,2]",
        "slicing_pairs=[]",  # the CI grid's pair (M = 8) does not divide this batch
        *(f"{key}={value}" for key, value in TINY.items()),
    ]
    code, output = _run_bench(tmp_path, overrides, timeout=300)
    assert code == 0, output[-3000:]
    report = tmp_path / "report"
    df = pd.read_csv(report / "results.csv")
    assert (df["status"] == "ok").all(), df.loc[df["status"] != "ok", "error"].tolist()
    assert len(df) == 1 + 2 + 2 + 1 + 2 + 1  # naive M=1 only; ZB-V, torch_1f1b need M ≥ P
    required = "schedule stages microbatches virtual_stages util_wall util_replayed util_theory "
    required += "bubble_fraction step_time_s peak_activation_bytes max_inflight_microbatches loss "
    required += "git_sha torch_version backend world_size timestamp wrong grad_error"
    assert set(required.split()) <= set(df.columns)
    # Every cell's loss and gradients equal one process's on the whole batch.
    assert (df["wrong"] == 0).all() and (df["grad_error"] < 1e-4).all(), df["grad_error"]
    assert df["loss"].max() - df["loss"].min() < 1e-5 * df["loss"].abs().max()
    ours = df[df["impl"] == "distbench"]
    assert ours["util_replayed"].between(0, 1).all() and ours["util_wall"].between(0, 1).all()
    assert df[df["impl"] == "torch"]["util_replayed"].isna().all()
    for artefact in [
        "report.md",
        "headline.json",
        "utilization_vs_m.png",
        "activation_memory.png",
        "gantt_naive_vs_gpipe.png",
    ]:
        assert (report / artefact).stat().st_size > 0, artefact
    for name in ours["trace_file"].dropna():
        assert (report / name).stat().st_size > 0, name


def test_a_compute_action_costs_the_fastest_of_its_stage_and_kind():
    # A disturbance only adds time: two profiling steps, one action slowed by a neighbour.
    from types import SimpleNamespace

    from bench.experiments.pipeline_utilization.timeline import action_costs
    from impls.pipeline import Action

    def rec(action: str, cpu_s: float) -> SimpleNamespace:
        return SimpleNamespace(action=action, kind=Action.parse(action).kind, cpu_s=cpu_s)

    steps = [
        {0: [rec("0F0", 2.0), rec("0F1", 9.0), rec("0SEND_F0", 5.0)], 1: [rec("1B0", 3.0)]},
        {0: [rec("0F0", 2.5), rec("0F1", 2.1)], 1: [rec("1B0", 3.5)]},
    ]
    costs = action_costs(steps)
    assert costs == {Action(0, "F", 0): 2.0, Action(0, "F", 1): 2.0, Action(1, "B", 0): 3.0}


def test_alpa_cut_sums_to_the_model_and_follows_the_costs():
    """Alpa's cut from given layer costs: deterministic, every block placed once; cheap end
    layers keep the equal split where P divides the blocks, a head dearer than a block
    takes blocks off the last stage, and at P = 3 the spare block goes where no end layer is."""
    cheap, heavy_head = LayerCosts(0.1, 1.0, 0.2), LayerCosts(0.1, 1.0, 2.5)
    assert alpa_layers(cheap, 16, 4, 8) == (4, 4, 4, 4) == equal_layers(16, 4)
    assert alpa_layers(cheap, 16, 3, 8) == (5, 6, 5) != equal_layers(16, 3)
    heavy = alpa_layers(heavy_head, 16, 4, 8)
    assert sum(heavy) == 16 and heavy[-1] < 4 and heavy == alpa_layers(heavy_head, 16, 4, 8)
    assert predicted_step_s(heavy_head, heavy, 8) < predicted_step_s(heavy_head, (4,) * 4, 8)
    # Eq. 2 by hand for the equal split: stages 4.1, 4, 4, 4.2; 16.3 + 7 × 4.2
    assert predicted_step_s(cheap, (4, 4, 4, 4), 8) == pytest.approx(16.3 + 7 * 4.2)


def test_slicing_pairs_add_both_cuts_measured_once(monkeypatch):
    """A pair whose equal cell is already in the grid adds only the alpa cell; both carry the
    one measurement of the layer costs, and the alpa cell carries its cut."""
    calls = []

    def fake(model, size, seed):
        calls.append(size)
        return LayerCosts(0.1, 1.0, 0.2)

    monkeypatch.setattr(pu_slicing, "measure_layer_costs", fake)
    cfg = PipelineUtilizationConfig(
        schedules=["gpipe"],
        stages=[3],
        microbatches=[4],
        batch_size=4,
        **TINY,
        slicing_pairs=[{"schedule": "gpipe", "stages": 3, "microbatches": 4}],
    )
    grid = cells(cfg)
    assert [c.key["slicing"] for c in grid] == ["equal", "alpa"] and calls == [1]
    equal, alpa = grid
    assert equal.carry.stage_layers is None and equal.carry.layer_costs is alpa.carry.layer_costs
    assert sum(alpa.carry.stage_layers) == cfg.n_layers and alpa.carry.trace is None


def test_old_rows_without_the_slicing_column_read_as_equal():
    assert [slicing_of(v) for v in (float("nan"), "", "equal", "alpa")] == [
        "equal",
        "equal",
        "equal",
        "alpa",
    ]


def test_layer_costs_leave_the_untimed_preparation_out():
    """Each layer's cost is its own call's CPU time: clearing the whole model's gradients
    before it (0.23 ms here, more than the embedding's own 0.06 ms) is not part of it."""
    import time

    def burn(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    cost = pu_slicing._cpu_seconds(lambda: burn(0.002), 3, prepare=lambda: burn(0.05))
    assert 0.002 <= cost < 0.025, cost
