"""The `planner_validation` report: the simulator calibrated on this host against the
configurations distbench measured here — errors per row, medians, the worst rows, the rank
correlation of step times, the calibration behind every prediction (its section in
`report_calibration.py`). Plots in `plots.py`."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pandas as pd

from bench.experiments.planner_validation.config import PROBE_LINK, SPLITS, repository_reports
from bench.experiments.planner_validation.plots import scatter_figure
from bench.experiments.planner_validation.report_calibration import calibration
from bench.report import (
    Context,
    Report,
    Target,
    format_bytes,
    format_percent,
    format_seconds,
    markdown_table,
    prose,
)
from bench.results import read_results

__all__ = ["MEMORY_BOUND", "REPORT", "SPEARMAN_BOUND", "STEP_BOUND", "prepare", "spearman"]

_prose = partial(prose, __package__)  # this experiment's prose.md.j2 macros

STEP_BOUND = 0.15  # issue 14: median step-time error ≤ 15%
MEMORY_BOUND = 0.05  # issue 14: peak-memory error ≤ 5%
SPEARMAN_BOUND = 0.8  # issue 14: Spearman ≥ 0.8
ISSUE = "issue 14 (done when: simulator against runs here)"
HELD_OUT_ISSUE = "issue 33 (done when: planner_validation on the held-out half)"


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """|step error| and |memory error|, the columns the targets read."""
    df = df.copy()
    for column in ("step_error", "memory_error"):
        values = pd.to_numeric(df[column], errors="coerce") if column in df else math.nan
        df[f"abs_{column}"] = abs(values)
    return df


def spearman(measured: pd.Series, predicted: pd.Series) -> float:
    """Spearman's ρ: Pearson's correlation of the ranks (ties averaged), as
    `scipy.stats.spearmanr` computes it; NaN with fewer than 3 rows or a constant side."""
    pair = pd.DataFrame(
        {
            "m": pd.to_numeric(measured, errors="coerce"),
            "p": pd.to_numeric(predicted, errors="coerce"),
        }
    ).dropna()
    if len(pair) < 3 or pair["m"].nunique() < 2 or pair["p"].nunique() < 2:
        return math.nan
    return float(pair["m"].rank().corr(pair["p"].rank()))


def _summary(rows: pd.DataFrame) -> dict[str, float]:
    signed = pd.to_numeric(rows["step_error"], errors="coerce")
    return {
        "rows": len(rows),
        "median_abs_step_error": float(rows["abs_step_error"].median()),
        "worst_abs_step_error": float(rows["abs_step_error"].max()),
        "rows_over_bound": int((rows["abs_step_error"] > STEP_BOUND).sum()),
        "median_step_error": float(signed.median()),
        "optimistic_rows": int((signed < 0).sum()),  # predicted faster than measured
        "median_abs_memory_error": float(rows["abs_memory_error"].median()),
        "worst_abs_memory_error": float(rows["abs_memory_error"].max()),
        "spearman_step_time": spearman(rows["measured_step_time_s"], rows["predicted_step_time_s"]),
    }


def _signed(value: float) -> str:
    return "—" if math.isnan(value) else f"{100 * value:+.1f}%"


def _summary_table(summaries: dict[str, dict[str, float]], halves: dict[str, str]) -> str:
    table = pd.DataFrame(
        [
            {
                "rows": name,
                "half (its sources)": halves.get(name, "—"),
                "configurations": s["rows"],
                "median abs step error": format_percent(s["median_abs_step_error"]),
                "worst abs step error": format_percent(s["worst_abs_step_error"]),
                f"rows over {STEP_BOUND:.0%}": s["rows_over_bound"],
                "median step error (signed)": _signed(s["median_step_error"]),
                "optimistic (predicted < measured)": s["optimistic_rows"],
                "median abs memory error": format_percent(s["median_abs_memory_error"]),
                "worst abs memory error": format_percent(s["worst_abs_memory_error"]),
                "Spearman ρ (step time)": "—"
                if math.isnan(s["spearman_step_time"])
                else f"{s['spearman_step_time']:.2f}",
            }
            for name, s in summaries.items()
        ]
    )
    return markdown_table(table, numparse=False)


def _summaries(ok: pd.DataFrame) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """({rows: summary} for all rows, each half and each source; {source: its half})."""
    summaries = {"all": _summary(ok)}
    split = ok["split"] if "split" in ok.columns else pd.Series("—", index=ok.index)
    halves = {
        str(source): str(split[ok["source"] == source].iloc[0]) for source in ok["source"].unique()
    }
    for half in SPLITS:
        if (split == half).any():
            summaries[half] = _summary(ok[split == half])
            halves[half] = ", ".join(sorted(s for s, h in halves.items() if h == half))
    for source, sub in ok.groupby("source"):
        summaries[str(source)] = _summary(sub)
    return summaries, halves


def accuracy(ctx: Context) -> str | None:
    """Accuracy: the development and the held-out half, medians, worst rows, rank correlation

    Step error = predicted ÷ measured − 1, memory error likewise, per row; Spearman's ρ
    ranks the configurations by measured and by predicted step time (all rows, each half,
    each source). A negative step error is an optimistic prediction (faster than
    measured). The issue's figures: median |step error| ≤ 15% on the held-out half (issue
    33), median |memory error| ≤ 5%, ρ ≥ 0.8 (issue 14). A prediction's error is not a
    measurement: the index shows it as a gap.

    The rows are split by source experiment, fixed in the config (`held_out`, column
    `split`): the step-time target is judged on the held-out half only. Which half the
    model's development looked at: the pricing rules and the calibration were written
    while every row of both halves was in view; the split came after them (issue 33), so
    the held-out half was held out only from then on. From the split on, the model is
    developed against the development half, and the held-out half's errors are read as
    its verdict, never tuned to.

    No number measured in a ground-truth cell prices that cell: the links, the TP call
    work and the calibration are this run's own measurements (Calibration). How fast the
    host ran is measured on both sides: the source's runner timed a small reference step
    (`bench.kit.host.host_probe`) between its cells, this run timed the same probe where it
    calibrated; their ratio is the row's `host_slowdown` (1 for a source without probes),
    the source's probe being the median over its other cells, the probes timed next to
    the row's own cell left out (`experiment.source_host_probe`). Rows are priced at the
    calibration's host speed unless `host_scaling` is on (the row's compute rates then
    divided by the ratio); the other prediction is shown beside (`step_error_unscaled`,
    `step_error_host_scaled`). Scaling is off by default: on the runs it was tried on
    it made the development half more optimistic every time, the held-out half on most
    (the config's `host_scaling` says which runs and by how much).

    A wall-clock step of N ranks ends with the slowest of them (they meet at every
    collective); the simulator prices one deterministic rank. Each such row is priced at
    the median of the slowest of N steps, modelled: if each rank's step varies
    independently as the reference's did in this run's calibration (each step ÷ the median
    of its timing window), that median is the distribution's quantile at 0.5^(1/N)
    (`calibration.straggler`; a replay prices each action alone and gets none). The error
    without it (`step_error_without_straggler`) is shown beside."""
    ok = ctx.ok
    if ok.empty:
        return None
    summaries, halves = _summaries(ok)
    ctx.headline["accuracy"] = summaries
    _index(ctx, summaries)
    errors = pd.to_numeric(ok["abs_step_error"], errors="coerce").dropna()
    table = _summary_table(summaries, halves)
    if errors.empty:
        return table
    worst = ok.loc[errors.idxmax()]
    worst = _prose(
        "worst_row",
        source=worst["source"],
        config=worst["config"],
        half=worst.get("split", "—"),
        truth=worst["ground_truth"],
        measured=format_seconds(worst["measured_step_time_s"]),
        predicted=format_seconds(worst["predicted_step_time_s"]),
    )
    return f"{table}\n\n{worst}{_host_speed(ctx, ok)}{_stragglers(ctx, ok)}"


def _index(ctx: Context, summaries: dict[str, dict[str, float]]) -> None:
    """The index's figures and the findings: the step target on the held-out half."""
    held = summaries.get("held_out")
    for half in SPLITS:
        s = summaries.get(half)
        if s is None:
            continue
        ctx.figure(
            f"simulator vs runs here: median |step-time error|, {half} half "
            f"({s['rows']} configurations)",
            theory=f"≤ {STEP_BOUND:.0%}",
            source=HELD_OUT_ISSUE if half == "held_out" else ISSUE + ", context",
            gap=format_percent(s["median_abs_step_error"]),
        )
    overall = summaries["all"]
    n = overall["rows"]
    ctx.figure(
        f"simulator vs runs here: median |peak-memory error| over {n} configurations",
        theory=f"≤ {MEMORY_BOUND:.0%}",
        source=ISSUE,
        gap=format_percent(overall["median_abs_memory_error"]),
    )
    rho = overall["spearman_step_time"]
    ctx.figure(
        f"simulator vs runs here: Spearman ρ of step times over {n} configurations",
        theory=f"≥ {SPEARMAN_BOUND}",
        source=ISSUE,
        gap="—" if math.isnan(rho) else f"ρ = {rho:.2f}",
    )
    median = held["median_abs_step_error"] if held else math.nan
    ctx.headline["held_out_step_target"] = {
        "median_abs_step_error": median,
        "bound": STEP_BOUND,
        "rows": held["rows"] if held else 0,
        "met": bool(median <= STEP_BOUND),
        "source": HELD_OUT_ISSUE,
    }
    ctx.finding(
        f"median |step-time error| ≤ {STEP_BOUND:.0%} on the held-out half",
        median <= STEP_BOUND,
        format_percent(median) if held else "no held-out row",
    )
    ctx.finding(
        f"median |peak-memory error| ≤ {MEMORY_BOUND:.0%}",
        overall["median_abs_memory_error"] <= MEMORY_BOUND,
        format_percent(overall["median_abs_memory_error"]),
    )
    ctx.finding(
        f"Spearman ρ of step times ≥ {SPEARMAN_BOUND}",
        not math.isnan(rho) and rho >= SPEARMAN_BOUND,
        f"ρ = {rho:.2f}",
    )


def _host_speed(ctx: Context, ok: pd.DataFrame) -> str:
    """The host-speed ratios of the rows' source runs, and the error priced at them and
    not (rows written before `host_scaling` were all priced at them)."""
    if "host_slowdown" not in ok.columns or "step_error_unscaled" not in ok.columns:
        return ""
    slowdown = pd.to_numeric(ok["host_slowdown"], errors="coerce")
    probed = pd.to_numeric(ok["host_probe_s"], errors="coerce").notna()
    plain = pd.to_numeric(ok["step_error_unscaled"], errors="coerce").abs()
    on = bool(ok["host_scaling"].astype(str).eq("True").all()) if "host_scaling" in ok else True
    scaled_column = "step_error_host_scaled" if "step_error_host_scaled" in ok else "step_error"
    scaled = pd.to_numeric(ok[scaled_column], errors="coerce").abs()
    ctx.headline["host_speed"] = {
        "host_scaling": on,
        "rows_probed": int(probed.sum()),
        "median_slowdown": float(slowdown[probed].median()) if probed.any() else math.nan,
        "min_slowdown": float(slowdown[probed].min()) if probed.any() else math.nan,
        "max_slowdown": float(slowdown[probed].max()) if probed.any() else math.nan,
        "median_abs_step_error_unscaled": float(plain.median()),
        "median_abs_step_error_host_scaled": float(scaled.median()),
    }
    if not probed.any():
        return "\n\n" + _prose("no_probes", error=format_percent(plain.median()))
    by_source = "; ".join(
        f"{source} {format_percent(plain[ok['source'] == source].median())}"
        for source in ok["source"].unique()
    )
    return "\n\n" + _prose(
        "host_speed",
        probed=int(probed.sum()),
        rows=len(ok),
        probe=format_seconds(float(ok["cal_host_probe_s"].iloc[0])),
        median=f"{slowdown[probed].median():.3f}",
        low=f"{slowdown[probed].min():.3f}",
        high=f"{slowdown[probed].max():.3f}",
        error=format_percent(plain.median()),
        scaled=format_percent(scaled.median()),
        on=on,
        by_source=by_source,
    )


def _stragglers(ctx: Context, ok: pd.DataFrame) -> str:
    """The straggler factor per rank count, and the error without it."""
    if "straggler" not in ok.columns or "step_error_without_straggler" not in ok.columns:
        return ""
    factor = pd.to_numeric(ok["straggler"], errors="coerce")
    priced = factor > 1
    alone = pd.to_numeric(ok["step_error_without_straggler"], errors="coerce").abs()
    per_n = {int(n): float(f) for n, f in ok[priced].groupby("ranks")["straggler"].first().items()}
    ctx.headline["stragglers"] = {
        "rows": int(priced.sum()),
        "factor_by_ranks": per_n,
        "median_abs_step_error_without": float(alone.median()),
    }
    if not priced.any():
        return ""
    factors = ", ".join(f"N = {n}: {f:.3f}×" for n, f in per_n.items())
    return "\n\n" + _prose(
        "stragglers", rows=int(priced.sum()), factors=factors, error=format_percent(alone.median())
    )


def scatter(ctx: Context) -> str | None:
    """Predicted against measured

    One point per configuration, log axes; the black line is a perfect prediction, the
    grey band the issue's tolerance (±15% for time, ±5% for memory)."""
    ok = ctx.ok
    if ok.empty:
        return None
    step = ctx.plot(
        scatter_figure(
            ok, "measured_step_time_s", "predicted_step_time_s", "step time (s)", STEP_BOUND
        ),
        "step_time_scatter",
        "predicted vs measured step time",
    )
    memory = ctx.plot(
        scatter_figure(
            ok,
            "measured_peak_bytes",
            "predicted_peak_bytes",
            "peak memory per rank (bytes)",
            MEMORY_BOUND,
        ),
        "memory_scatter",
        "predicted vs measured peak memory",
    )
    return f"{step}\n\n{memory}"


def every_row(ctx: Context) -> str | None:
    """Every configuration

    `ground truth` says which measured time a row is held to: the wall clock (ranks ≤
    cores), the source's replayed timeline (each rank's compute timed with the host to
    itself), or the wall clock with modelled core sharing (more ranks than cores, no
    replay: each rank predicted on cores/N of the host). `memory` is what the source
    measured per rank: model states + saved activations (+ ZeRO-3's gathered parameters),
    or the saved activations alone (pipeline_utilization). `statistic` is what the
    measured time is of its samples, and which reference fit predicts it (Calibration).
    `commit` is the commit that measured the ground truth; `half` the row's split.
    `host slowdown` is how much slower the host ran during the row's source run than where
    this run calibrated (its source's probes between its other cells), `error unscaled`
    the error priced at the calibration's speed and `error host-scaled` at the source
    run's (`host_scaling` says which of the two is the row's step error);
    `straggler` the slowest-of-N factor a wall-clock row of N ≥ 2 ranks is priced at
    (modelled, Accuracy) and `runtime` the runtime its source steps under (Calibration)."""
    ok = ctx.ok
    if ok.empty:
        return None
    table = pd.DataFrame(
        {
            "source": ok["source"],
            "half": ok.get("split", "—"),
            "configuration": ok["config"],
            "ranks": ok["ranks"],
            "ground truth": ok["ground_truth"],
            "statistic": ok.get("statistic", "median"),
            "commit": ok["source_git_sha"],
            "link": ok.get("link_source", PROBE_LINK),
            "measured": ok["measured_step_time_s"].map(format_seconds),
            "predicted": ok["predicted_step_time_s"].map(format_seconds),
            "step error": ok["step_error"].map(lambda v: f"{v:+.0%}"),
            "host slowdown": ok["host_slowdown"].map(lambda v: f"{v:.3f}×")
            if "host_slowdown" in ok
            else "—",
            "error unscaled": ok["step_error_unscaled"].map(lambda v: f"{v:+.0%}")
            if "step_error_unscaled" in ok
            else "—",
            "error host-scaled": ok["step_error_host_scaled"].map(lambda v: f"{v:+.0%}")
            if "step_error_host_scaled" in ok
            else "—",
            "straggler": ok["straggler"].map(lambda v: f"{v:.3f}×") if "straggler" in ok else "—",
            "runtime": ok["runtime"].fillna("—") if "runtime" in ok else "—",
            "memory": ok["memory_measure"],
            "measured bytes": ok["measured_peak_bytes"].map(format_bytes),
            "predicted bytes": ok["predicted_peak_bytes"].map(format_bytes),
            "memory error": ok["memory_error"].map(lambda v: f"{v:+.1%}"),
            "compute / bubble / TP / PP / DP / optimizer": ok.apply(_breakdown, axis=1),
        }
    )
    ctx.headline["ground_truth_commits"] = sorted({str(c) for c in ok["source_git_sha"]})
    return markdown_table(table, numparse=False)


def _breakdown(row: pd.Series) -> str:
    parts = (
        "predicted_compute_s",
        "predicted_bubble_s",
        "predicted_tp_s",
        "predicted_pp_s",
        "predicted_dp_s",
        "predicted_optimizer_s",
    )
    return " / ".join(f"{1e3 * float(row[p]):.0f}" for p in parts) + " ms"


SLICING_COLUMNS = {
    "schedule": "schedule",
    "stages": "P",
    "microbatches": "M",
    "slicing": "slicing",
    "stage_layers": "blocks per stage",
    "predicted_step_s": "Eq. 2 (s)",
    "replayed_makespan_s": "replayed (s)",
    "step_time_s": "wall clock (s)",
}


def alpa_slicing(ctx: Context) -> str | None:
    """Alpa-style stage slicing against equal slicing

    The planner's inter-operator pass (Alpa's stage slicing, `impls.planner.slicing`) on the
    16-layer GPT with its embedding and LM head is run by `pipeline_utilization`
    (`slicing_pairs`): each pair runs equal slicing and Alpa's cut, decided from layer costs
    measured on this host. Its rows, read from that report's results.csv; the comparison
    (and whether Alpa's split is measured faster) is that report's section "Alpa-style
    slicing vs equal slicing"."""
    if ctx.ok.empty:
        return None
    root = ctx.settings.get("reports_root")
    path = (Path(root) if root else repository_reports()) / "pipeline_utilization/results.csv"
    rows = read_results(path) if path.is_file() else None
    if rows is None or "slicing" not in rows.columns or not (rows["slicing"] == "alpa").any():
        return _prose("no_alpa", path=path)
    alpa = rows[(rows["status"] == "ok") & (rows["slicing"] == "alpa")]
    keys = ["schedule", "stages", "microbatches", "virtual_stages"]
    _check_pairs(path, keys)
    pairs = rows[rows["status"] == "ok"].merge(alpa[keys], on=keys)
    shown = pairs.reindex(columns=list(SLICING_COLUMNS)).rename(columns=SLICING_COLUMNS)
    for column in ("Eq. 2 (s)", "replayed (s)", "wall clock (s)"):
        shown[column] = shown[column].map(format_seconds)
    return markdown_table(shown, numparse=False)


def _check_pairs(path: Path, keys: list[str]) -> None:
    """The measured times of the finished rows `alpa_slicing` shows (each Alpa cut and its
    equal twin), checked as the cells check their ground truth (`experiment.measured`)."""
    from bench.experiments.planner_validation.experiment import measured, ok_rows

    rows = ok_rows(path)
    alpa = {tuple(r.get(k) for k in keys) for r in rows if r.get("slicing") == "alpa"}
    for row in rows:
        if tuple(row.get(k) for k in keys) in alpa:
            for column in ("replayed_makespan_s", "step_time_s"):
                measured(row, column)


def _per_row(figure: str, column: str, bound: float, **where: str) -> Target:
    """The issue's bound judged on every configuration `where` selects (its worst row
    shown; the verdict's median is that half's median)."""
    return Target(
        figure=figure,
        column=column,
        op="<=",
        bound=bound,
        where=where,
        source=ISSUE + ", per row",
        fmt=format_percent,
    )


REPORT = Report(
    title="Planner validation: the simulator, calibrated here, against runs here",
    intro=_prose("intro"),
    sections=(accuracy, scatter, calibration, every_row, alpa_slicing),
    targets=(
        _per_row(
            "|step-time error| per configuration, held-out half",
            "abs_step_error",
            STEP_BOUND,
            split="held_out",
        ),
        _per_row("|peak-memory error| per configuration", "abs_memory_error", MEMORY_BOUND),
    ),
    prepare=prepare,
)
