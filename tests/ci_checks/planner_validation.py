"""planner_validation on the CI grid (a few ground-truth rows of each source, predicted on
a quick calibration): every row has a positive prediction and its errors are the ratios of
its own columns, each row's ground truth is labelled by the rule (wall clock only where
ranks ≤ cores), the composed memory is within the issue's 5% of what the sources measured,
the calibration is positive, each row is priced at its source run's host speed and on
this run's link and TP call work (never its own cell's), each row pays its source's runtime and (wall clock, N ≥ 2) the slowest of its
ranks, every row carries its half (`split`, by source as the config's `held_out` says)
and the step-time target is judged on the held-out half alone and bounds its median, and
the index carries the medians and ρ as gaps, never as measurements."""

from __future__ import annotations

import math

import pandas as pd

from bench.experiments.planner_validation.config import HELD_OUT, PROBE_LINK, SPLITS
from impls.costmodel.comm import allreduce_rounds
from tests.ci_checks import ran

ARTEFACTS = ("step_time_scatter", "memory_scatter")
MEMORY_BOUND = 0.05


def _positive(row: pd.Series, *columns: str) -> None:
    for column in columns:
        value = float(row[column])
        assert math.isfinite(value) and value > 0, (column, value, row["config"])


def errors_are_the_ratios_of_each_row(df: pd.DataFrame, headline: dict) -> None:
    for _, row in ran(df).iterrows():
        _positive(
            row,
            "measured_step_time_s",
            "predicted_step_time_s",
            "measured_peak_bytes",
            "predicted_peak_bytes",
            "predicted_compute_s",
        )
        step = row["predicted_step_time_s"] / row["measured_step_time_s"] - 1
        memory = row["predicted_peak_bytes"] / row["measured_peak_bytes"] - 1
        assert math.isclose(step, row["step_error"], rel_tol=1e-9, abs_tol=1e-12), row
        assert math.isclose(memory, row["memory_error"], rel_tol=1e-9, abs_tol=1e-12), row


def ground_truth_is_labelled_by_the_rule(df: pd.DataFrame, headline: dict) -> None:
    done = ran(df)
    assert set(done["source"]) >= {
        "parallelism_comparison",
        "zero_memory",
        "pipeline_utilization",
    }, set(done["source"])
    for _, row in done.iterrows():
        ranks, cores = float(row["ranks"]), float(row["source_host_cores"])
        assert ranks >= 1 and cores >= 1, (ranks, cores)
        label = str(row["ground_truth"])
        if ranks <= cores:
            assert label == "wall clock", (row["config"], label)
        else:
            assert label == "replayed" or "modelled core sharing" in label, label
        assert isinstance(row["source_git_sha"], str) and row["source_git_sha"], row


def links_follow_the_rank_count(df: pd.DataFrame, headline: dict) -> None:
    """A row priced on a ring fit is a wall-clock row of that fit's N; the CI grid's
    allreduce_scaling runs N = 2, so the two-rank wall-clock rows use its ring."""
    done = ran(df)
    for _, row in done.iterrows():
        source, ranks = str(row["link_source"]), float(row["ranks"])
        assert math.isfinite(ranks) and ranks >= 1, (row["config"], ranks)
        if source.startswith("allreduce_scaling ring, N="):
            assert int(source.rsplit("=", 1)[1]) == ranks, (row["config"], source)
            assert row["ground_truth"] != "replayed", (row["config"], source)
        else:
            assert source == PROBE_LINK, source
    two = done[(done["ranks"] == 2) & (done["ground_truth"] == "wall clock")]
    assert (two["link_source"] == "allreduce_scaling ring, N=2").all(), two["link_source"]
    assert set(headline["links"]) == set(done["link_source"]), headline["links"]


def composed_memory_within_five_percent(df: pd.DataFrame, headline: dict) -> None:
    for _, row in ran(df).iterrows():
        error = float(row["memory_error"])
        assert math.isfinite(error) and abs(error) <= MEMORY_BOUND, (row["config"], error)
        _positive(row, "predicted_activation_bytes")


def calibration_is_positive_and_recorded(df: pd.DataFrame, headline: dict) -> None:
    for _, row in ran(df).iterrows():
        _positive(
            row,
            "cal_peak_fp32_flops",
            "cal_memory_bandwidth",
            "cal_kernel_overhead_s",
            "fit_scale",
            "fit_overhead_s",
            "link_alpha_s",
            "link_beta_s_per_byte",
            "compute_rate",
            "cal_adamw_s_per_param",
        )
        # a rank's thread speedup is measured on the reference and bounded to [1, threads]
        assert 1.0 <= row["cal_thread_speedup"] <= row["threads_per_rank"], row.to_dict()
        if row["optimizer_params"] > 0 and row["predicted_optimizer_s"] > 0:  # AdamW priced
            # at the host speed of its source's run (its slowdown; × the straggler factor
            # on a wall clock of several ranks), ÷ a core share when crowded
            host = row["host_slowdown"] if _scaled(row) else 1.0
            assert row["predicted_optimizer_s"] >= row["cal_adamw_s_per_param"] * row[
                "optimizer_params"
            ] * host * (1 - 1e-9), row.to_dict()
        # a row is predicted on the fit to its own statistic: the fastest only for
        # pipeline_utilization's replay (its actions priced at their fastest)
        fastest = row["source"] == "pipeline_utilization" and row["ground_truth"] == "replayed"
        statistic = "fastest" if fastest else "median"
        assert row["statistic"] == statistic, (row["config"], row["statistic"])
        assert row["fit_scale"] == row[f"fit_{statistic}_scale"], row["config"]
        assert row["fit_overhead_s"] == row[f"fit_{statistic}_overhead_s"], row["config"]
        for dtype in ("fp32", "bf16"):  # each statistic of the reference, as measured
            for micro in (1, 16):
                median_s, fastest_s = (
                    row[f"reference_{dtype}_micro{micro}{k}_s"] for k in ("", "_fastest")
                )
                assert 0 < fastest_s <= median_s < math.inf, (dtype, micro, fastest_s, median_s)
    link = headline["calibration"]["link"]
    if (ran(df)["link_source"] == PROBE_LINK).any():
        assert link["alpha_s"] > 0 and link["beta_s_per_byte"] > 0, link
    assert headline["ground_truth_commits"], headline["ground_truth_commits"]


def index_shows_errors_as_gaps(df: pd.DataFrame, headline: dict) -> None:
    figures = [f for f in headline["figures"] if f["figure"].startswith("simulator vs runs")]
    assert len(figures) == 4, figures  # each half's median step error, memory, ρ
    assert sum("held_out half" in f["figure"] for f in figures) == 1, figures
    assert all(f["measured"] == "—" and f["gap"] != "—" for f in figures), figures
    overall = headline["accuracy"]["all"]
    assert overall["rows"] == len(ran(df)), overall
    rho = overall["spearman_step_time"]
    assert math.isfinite(rho) and -1 <= rho <= 1, rho
    assert 0 < overall["median_abs_step_error"] < math.inf, overall


def _scaled(row: pd.Series) -> bool:
    """Whether the row was priced at its source run's host speed (`host_scaling`)."""
    return str(row["host_scaling"]) == "True"


def no_row_is_priced_on_its_own_cell(df: pd.DataFrame, headline: dict) -> None:
    """A row's host slowdown is its source probe ÷ the calibration's (a source without
    probes at 1, both predictions equal); it is priced at the calibration's host speed, or
    at that slowdown where `host_scaling` is on (off by default), and carries the other
    prediction beside, each error the ratio of its own columns. A replayed TP row's α per round carries the call
    work this run measured on its tp ranks at its activation size (one value per size),
    over the ring's 2(t − 1) rounds; every other row is priced at its link's α and
    measures none; this run's own link and call work are scaled to the source's host
    speed, a ring fit read from a report is not. Every row on the probe link is priced on
    one link, this run's. (The source probe leaving out the row's own cell is pinned by
    the unit tests.)"""
    done = ran(df)
    calls: dict[tuple[int, int], float] = {}
    for _, row in done.iterrows():
        _positive(
            row,
            "cal_host_probe_s",
            "host_slowdown",
            "predicted_unscaled_step_time_s",
            "predicted_host_scaled_step_time_s",
        )
        unscaled, scaled = (row[f"predicted_{k}_step_time_s"] for k in ("unscaled", "host_scaled"))
        if math.isnan(float(row["host_probe_s"])):
            assert row["host_slowdown"] == 1.0 and unscaled == scaled, row["config"]
        else:
            ratio = row["host_probe_s"] / row["cal_host_probe_s"]
            assert math.isclose(row["host_slowdown"], ratio, rel_tol=1e-9), row["config"]
        on = _scaled(row)
        assert row["predicted_step_time_s"] == (scaled if on else unscaled), row["config"]
        for kind, predicted in (("unscaled", unscaled), ("host_scaled", scaled)):
            error = predicted / row["measured_step_time_s"] - 1
            assert math.isclose(error, row[f"step_error_{kind}"], rel_tol=1e-9), row["config"]
        tp, call, numel = int(row["tp"]), float(row["tp_call_cpu_s"]), int(row["tp_call_numel"])
        alpha, scale = row["link_alpha_s"], float(row["link_scale"])
        own = row["link_source"] == PROBE_LINK  # this run's link: at the host speed priced
        assert scale == (row["host_slowdown"] if own and on else 1.0), row["config"]
        if row["ground_truth"] == "replayed" and tp > 1:
            assert call > 0 and numel > 0, row["config"]
            assert calls.setdefault((tp, numel), call) == call, row["config"]
            alpha += call / allreduce_rounds(tp)
        else:
            assert call == 0 and numel == 0, row["config"]
        assert math.isclose(row["round_alpha_s"], alpha * scale, rel_tol=1e-9), row["config"]
    probed = done[done["link_source"] == PROBE_LINK]
    assert probed["link_alpha_s"].nunique() <= 1, probed["link_alpha_s"].unique()
    speed = headline["host_speed"]
    assert speed["rows_probed"] == int(
        pd.to_numeric(done["host_probe_s"], errors="coerce").notna().sum()
    ), speed
    assert 0 < speed["median_abs_step_error_unscaled"] < math.inf, speed
    assert 0 < speed["median_abs_step_error_host_scaled"] < math.inf, speed
    assert speed["host_scaling"] == headline["settings"].get("host_scaling", False), speed


HELD_OUT_BOUND = 0.15  # issue 33: median |step error| ≤ 15% on the held-out half


def the_held_out_half_is_judged_apart(df: pd.DataFrame, headline: dict) -> None:
    """Every row carries its half, by source as the config's `held_out` says, and the CI
    grid has both; the per-row step-time target applies to the held-out rows alone, the
    median it reports is theirs, and that median is within the issue's 15%."""
    done = ran(df)
    held_out = set(headline.get("settings", {}).get("held_out", HELD_OUT))  # the run's config
    for _, row in done.iterrows():
        assert row["split"] in SPLITS, (row["config"], row["split"])
        assert (row["split"] == "held_out") == (row["source"] in held_out), row["config"]
    assert set(done["split"]) == set(SPLITS), set(done["split"])
    held = done[done["split"] == "held_out"]
    for _, row in held.iterrows():
        _positive(row, "measured_step_time_s", "predicted_step_time_s")
    median = float(held["step_error"].abs().median())
    (step,) = [t for t in headline["targets"] if t["column"] == "abs_step_error"]
    assert step["where"] == {"split": "held_out"} and step["cells"] == len(held), step
    assert math.isclose(step["median"], median, rel_tol=1e-9), (step["median"], median)
    target = headline["held_out_step_target"]
    assert target["rows"] == len(held) and math.isclose(target["median_abs_step_error"], median)
    summaries = headline["accuracy"]
    assert summaries["held_out"]["rows"] + summaries["development"]["rows"] == len(done)
    assert target["met"] and median <= HELD_OUT_BOUND, median


RUNTIME_OF = {
    "parallelism_comparison": "executor",
    "pipeline_utilization": "executor",
    "zero_memory": "ledger",
}


def rows_pay_their_runtime_and_stragglers(df: pd.DataFrame, headline: dict) -> None:
    """Each row pays its source's runtime per compute action, as this run measured it
    (≥ 0); a wall-clock row of N ≥ 2 ranks is priced at the slowest-of-N factor (≥ 1, the
    same for every row of that N, not falling with N), every other row at 1, and its
    error without the factor is the ratio of its own columns."""
    done = ran(df)
    factors: dict[int, float] = {}
    for _, row in done.iterrows():
        runtime = RUNTIME_OF[row["source"]]
        assert row["runtime"] == runtime, (row["config"], row["runtime"])
        cost = float(row["action_overhead_s"])
        assert cost == row[f"cal_action_overhead_{runtime}_s"] and cost >= 0, row["config"]
        n, factor = int(row["ranks"]), float(row["straggler"])
        if row["ground_truth"] == "replayed" or n == 1:
            assert factor == 1.0, row["config"]
            assert row["predicted_without_straggler_step_time_s"] == row["predicted_step_time_s"]
        else:
            assert factor >= 1.0 and factors.setdefault(n, factor) == factor, row["config"]
        alone = row["predicted_without_straggler_step_time_s"] / row["measured_step_time_s"] - 1
        assert math.isclose(alone, row["step_error_without_straggler"], rel_tol=1e-9)
    ordered = [factors[n] for n in sorted(factors)]
    assert ordered == sorted(ordered), factors
    shown = {int(n): f for n, f in headline["stragglers"]["factor_by_ranks"].items()}
    assert shown == {n: f for n, f in factors.items() if f > 1}, (shown, factors)


def meetings_are_paid_only_on_the_probed_wall_clock(df: pd.DataFrame, headline: dict) -> None:
    """Where the meeting probe ran, a wall-clock row on as many ranks as it (and no more
    than the cores) pays the probe's call after compute less its link's price of that call
    (≥ 0, the same for rows on the same link); every other row pays nothing. On a host of
    two cores or more every row records the probe: two ranks, its loops' times > 0."""
    done = ran(df)
    for _, row in done.iterrows():
        if int(row["host_cores"]) >= 2:
            assert row["cal_meeting_world_size"] == 2, row["config"]
            for key in ("segment_s", "call_s"):
                assert row[f"cal_meeting_{key}"] > 0, (row["config"], key)
            assert math.isfinite(row["cal_meeting_after_compute_s"]), row["config"]
        meet, probed = float(row["collective_meeting_s"]), float(row["cal_meeting_world_size"])
        n, wall = int(row["ranks"]), row["ground_truth"] == "wall clock"
        if not (wall and n >= 2 and n == probed):
            assert meet == 0.0, (row["config"], meet)
            continue
        rounds = allreduce_rounds(n)
        price = rounds * row["round_alpha_s"] + rounds / n * 4 * row["link_beta_s_per_byte"]
        want = max(0.0, float(row["cal_meeting_after_compute_s"]) - price)
        assert math.isclose(meet, want, rel_tol=1e-9, abs_tol=1e-15), (row["config"], meet, want)


CHECKS = (
    errors_are_the_ratios_of_each_row,
    ground_truth_is_labelled_by_the_rule,
    links_follow_the_rank_count,
    composed_memory_within_five_percent,
    calibration_is_positive_and_recorded,
    index_shows_errors_as_gaps,
    no_row_is_priced_on_its_own_cell,
    rows_pay_their_runtime_and_stragglers,
    meetings_are_paid_only_on_the_probed_wall_clock,
    the_held_out_half_is_judged_apart,
)
