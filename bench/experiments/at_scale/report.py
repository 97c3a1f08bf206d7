"""The `at_scale` report: the simulator's predictions beside the lecture's scale figures
and published training runs. Predictions are model outputs; the published numbers are
the papers' measurements; nothing is measured here."""

from __future__ import annotations

import math

import pandas as pd

from bench.report import (
    Context,
    Report,
    Target,
    format_count,
    format_percent,
    markdown_table,
    new_figure,
    prose,
)

__all__ = ["PUBLISHED_TARGET", "REPORT", "SUMMIT_TARGET"]

ISSUE = "issue #14"
HONEST = "issue #33"
PUBLISHED_TARGET = Target(
    figure="published runs: |simulator ÷ published throughput − 1| (no fitting to them)",
    column="abs_error",
    op="<=",
    bound=0.25,
    where={"kind": "published"},
    source=f"{HONEST}: every row ≤ 25% (and the median ≤ 10%, judged below)",
    fmt=format_percent,
)
MEDIAN_BOUND = 0.10  # issue #33: median |error| ≤ 10% over ≥ 40 rows from ≥ 8 sources
LOSO_BOUND = 0.12  # issue #33: leave-one-source-out median ≤ 12%
OPTIMISTIC_BAND = (0.35, 0.65)  # issue #33: optimistic rows between 35% and 65% of all
SERIES_BOUND = 5.0  # issue #33: the predicted MFU decline with DP within 5 points
LAYOUT = ("dp", "cp", "tp", "pp")
SERIES_KEYS = ("origin", "model", "hardware", "seq_len", "microbatch_size", "tp", "pp", "metric")
SUMMIT_TARGET = Target(
    figure="SUMMIT TSM data-parallel scaling efficiency: |simulator − lecture| (points)",
    column="efficiency_gap_points",
    op="<=",
    bound=10.0,
    where={"kind": "lecture", "name": ["summit_768", "summit_1536"]},
    source=f"{ISSUE}: within 10 points of the measured scaling efficiency",
    fmt=lambda v: f"{v:.1f} points",
)
GPT3_TARGET = Target(
    figure="GPT-3 175B GPU-hours under the lecture's assumptions (V100 at 28 TFLOP/s): "
    "|simulator ÷ lecture − 1|",
    column="abs_error",
    op="<=",
    bound=0.20,
    where={"kind": "lecture", "name": "gpt3_gpu_hours_lambda"},
    source=f"{ISSUE}: within 20% of 3.1M under the stated assumptions",
    fmt=format_percent,
)


def _true(values: pd.Series) -> pd.Series:
    return values.astype(str).isin(["True", "true", "1"])


def _signed(value: float) -> str:
    return f"{100 * value:+.1f}%"


def _fmt(value: float) -> str:
    if value is None or not math.isfinite(float(value)):
        return "—"
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _times(ratio: float) -> str:
    return _fmt(ratio) + "×" if math.isfinite(ratio) else "—"


def _rows(ctx: Context, kind: str) -> pd.DataFrame:
    ok = ctx.ok
    return ok[ok["kind"] == kind] if not ok.empty else ok


def lecture(ctx: Context) -> str | None:
    """The lecture's scale figures

    GPT-3 175B (C = 6ND, N = 175B, D = 300B tokens): the lecture's 3.1M GPU-hours and 355
    years are C ÷ 28 TFLOP/s, the V100's half-precision peak without tensor cores that
    Lambda's estimate assumed at 100% utilisation (the lecture's "measured on A100" does not
    match that arithmetic). The simulator plans the run (1024 GPUs by default) and prices
    it twice: `gpt3_gpu_hours_lambda` on V100s computing at those 28 TFLOP/s with every
    GEMM at 100% (the stated assumptions: what the simulator adds is communication, the
    pipeline bubble, element-wise work and the optimizer), and `gpt3_gpu_hours` on the
    configured cluster (A100 by default, the GPU the lecture names). SUMMIT: the TSM
    ResNet-50 data-parallel run on 6, 768 and 1536 V100, the lecture's training times
    against the simulator's, and the scaling efficiency T₆·6 ÷ (T_N·N) of each, at 8 clips
    per GPU (the paper's 12,288-clip batch on 1536 GPUs) and fp32 compute (an assumption:
    fp16 tensor cores would make the predicted times an order of magnitude shorter than the
    measured ones). The simulator prices compute and the gradient all-reduce only; the TSM
    authors name data loading as a third bottleneck, which it does not model. Chinchilla:
    N = √(C/120), D = 20N for the budget C, and the predicted days on the chosen cluster."""
    rows = _rows(ctx, "lecture")
    if rows.empty:
        return None
    arithmetic = rows.get("lecture_arithmetic", pd.Series(math.nan, index=rows.index))
    table = pd.DataFrame(
        {
            "figure": rows["name"],
            "what": rows["metric"],
            "lecture": rows["published"].map(_fmt),
            "lecture's own arithmetic": arithmetic.map(_fmt),
            "simulator (model output)": rows["predicted"].map(_fmt),
            "simulator ÷ lecture": rows["ratio"].map(_times),
        }
    )
    for _, row in rows.iterrows():
        figure, source = f"{row['name']}: {row['metric']}", str(row["source"])
        theory, model = _fmt(row["published"]), _fmt(row["predicted"])
        ctx.figure(figure, theory=theory, source=source, model=model, gap=_times(row["ratio"]))
    out = [markdown_table(table, numparse=False)]
    summit = rows[rows["name"].astype(str).str.startswith("summit")]
    if not summit.empty and "predicted_scaling_efficiency" in summit.columns:
        eff = pd.DataFrame(
            {
                "GPUs": summit["gpus"].map(format_count),
                "lecture": summit["published_scaling_efficiency"].map(format_percent),
                "simulator": summit["predicted_scaling_efficiency"].map(format_percent),
                "gap (points)": summit["efficiency_gap_points"].map(lambda v: f"{v:.1f}"),
            }
        )
        out.append(prose(__package__, "efficiency", table=markdown_table(eff, numparse=False)))
    _lecture_findings(ctx, rows)
    for _, row in rows[rows["name"] == "chinchilla"].iterrows():
        n, d = f"{row['optimal_params'] / 1e9:.1f}", f"{row['optimal_tokens'] / 1e12:.2f}"
        size = f"{row['model_params'] / 1e9:.1f}"
        out.append(prose(__package__, "chinchilla", n=n, d=d, model=row["model"], size=size))
    return "\n\n".join(out)


def _lecture_findings(ctx: Context, rows: pd.DataFrame) -> None:
    """Whether the lecture's figures hold as the lecture labels them, from this run's rows."""
    for _, row in rows[rows["name"] == "gpt3_gpu_hours"].iterrows():
        gpus, predicted, ratio = (
            format_count(row["gpus"]),
            _fmt(row["predicted"]),
            _fmt(row["ratio"]),
        )
        claim = prose(__package__, "gpt3_claim", gpus=gpus, hardware=row["hardware"])
        detail = prose(__package__, "gpt3_detail", predicted=predicted, ratio=ratio)
        ctx.finding(claim, holds=bool(row["abs_error"] <= GPT3_TARGET.bound), detail=detail)
    summit = rows[rows["name"].astype(str).str.startswith("summit_")]
    gaps = (pd.to_numeric(summit["ratio"], errors="coerce") - 1).abs().dropna()
    if not gaps.empty:
        worst = summit.loc[gaps.idxmax()]
        numbers = {k: _fmt(worst[k]) for k in ("predicted", "ratio", "published")}
        detail = prose(__package__, "summit_detail", name=worst["name"], **numbers)
        holds = bool(abs(worst["ratio"] - 1) <= 0.2)
        ctx.finding(prose(__package__, "summit_claim"), holds=holds, detail=detail)


def published(ctx: Context) -> str | None:
    """Published runs

    Each run's model, GPUs, parallel layout and batch as its source states them (fields the
    source leaves out are listed under "assumed"), priced by the simulator and compared in
    the source's own convention (Megatron-LM's TFLOP/s count the recomputed forward). The
    simulator's inputs are datasheets and microbenchmarks only: no published throughput
    was used to set any of them. The error is signed: above zero the model is optimistic
    (it promises more than the run achieved). Each row's 90% interval is built from the
    other sources' residuals only (the 5th–95th percentile of ln(predicted ÷ published)
    over every row of every other source), so it is an interval the row's own source never
    shaped; "covered" says whether the published number falls inside it.

    Where the model is still optimistic. Megatron-LM's own runs (SC'21, its README) are
    priced within about ±10%; the FSDP runs (llm-foundry, torchtitan, fms-fsdp, TinyLlama)
    and NeMo's small-model rows run slower than priced. Hidden FSDP collectives are charged
    the SMs NCCL takes from the compute beside them, and fms-fsdp is priced on the node
    network its source states; what is left is compute that runs below the GEMM and
    FlashAttention figures the presets cite. Candidates, none priced for want of a cited
    measurement: each framework's unfused element-wise kernels (eager RMSNorm, rotary,
    SwiGLU), the caching allocator near full memory, GEMM shapes below MAMF's searched best,
    and sustained clocks below a microbenchmark's."""
    rows = _rows(ctx, "published")
    if rows.empty:
        return None
    error, fits = rows["ratio"] - 1, _true(rows["fits"])
    layout = rows.apply(lambda r: "·".join(format_count(r.get(k, 1)) for k in LAYOUT), axis=1)
    peak = rows["predicted_peak_memory_gb"].astype(float)
    table = pd.DataFrame(
        {
            "run": rows["name"],
            "GPUs": rows["gpus"].map(format_count),
            "layout (dp·cp·tp·pp)": layout,
            "metric": rows["metric"],
            "published": rows["published"].map(_fmt),
            "simulator": rows["predicted"].map(_fmt),
            "error": error.map(_signed),
            "90% interval (other sources)": rows.apply(_interval_text, axis=1),
            "peak GB (fits)": [
                f"{gb:.1f} ({'yes' if fit else 'no'})" for gb, fit in zip(peak, fits, strict=True)
            ],
            "assumed": rows["assumed"],
            "source": rows["source"],
        }
    )
    n, median, optimistic = len(rows), float(rows["abs_error"].median()), float((error > 0).mean())
    over, under = int((error > 0).sum()), int((error <= 0).sum())
    low, high = (format_percent(bound) for bound in OPTIMISTIC_BAND)
    ctx.figure(
        f"published runs: median |simulator ÷ published − 1| over {n} rows",
        theory=f"≤ {format_percent(MEDIAN_BOUND)}",
        source=HONEST,
        model=format_percent(median),
    )
    ctx.figure(
        f"published runs: share of optimistic rows (simulator above published) over {n} rows",
        theory=f"{low}–{high}",
        source=HONEST,
        model=format_percent(optimistic),
    )
    ctx.headline["published_median_error"] = median
    ctx.headline["published_rows"] = n
    ctx.headline["published_optimistic_share"] = optimistic
    per_source, covered = _per_source(ctx, rows)
    ctx.headline["published_fit_share"] = float(fits.mean())
    unfit = "" if fits.all() else "; not: " + ", ".join(rows.loc[~fits, "name"])
    ctx.finding(
        "every published run fits in memory in the plan it trained with",
        holds=bool(fits.all()),
        detail=f"{int(fits.sum())} of {n} fit{unfit}",
    )
    ctx.finding(
        f"median |error| ≤ {format_percent(MEDIAN_BOUND)} over the published rows",
        holds=median <= MEDIAN_BOUND,
        detail=f"{format_percent(median)} over {n} rows from {rows['origin'].nunique()} source families",
    )
    ctx.finding(
        "optimistic rows between 35% and 65% of all (errors not of one sign)",
        holds=OPTIMISTIC_BAND[0] <= optimistic <= OPTIMISTIC_BAND[1],
        detail=f"{over} of {n} optimistic",
    )
    counts = {"rows": n, "over": over, "under": under, "covered": covered}
    summary = prose(__package__, "published", median=format_percent(median), **counts)
    table = markdown_table(table, numparse=False)
    return "\n\n".join([table, summary, per_source, _plot(ctx, rows)])


def _interval_text(row: pd.Series) -> str:
    low, high = row.get("interval_low"), row.get("interval_high")
    if low is None or not math.isfinite(float(low)):
        return "—"
    mark = "" if bool(row.get("interval_covers")) else " (not covered)"
    return f"{_fmt(low)}–{_fmt(high)}{mark}"


def _per_source(ctx: Context, rows: pd.DataFrame) -> tuple[str, int]:
    """The per-source table and how many rows the other sources' interval covers.

    No term of the simulator is fitted to a published run, so a row's error is the same
    whether or not its source is held out: the leave-one-source-out median |error| equals
    the plain median, and what holding a source out tests is the interval."""
    covers = _true(rows["interval_covers"])
    error = pd.to_numeric(rows["ratio"], errors="coerce") - 1
    frame = rows.assign(covered=covers, optimistic=error > 0, error=error)
    grouped = frame.groupby("origin", sort=False)
    table = (
        pd.DataFrame(
            {
                "rows": grouped.size(),
                "median |error|": grouped["abs_error"].median().map(format_percent),
                "median error (signed)": grouped["error"].median().map(_signed),
                "optimistic": grouped["optimistic"].sum().astype(int),
                "covered by the other sources' 90% interval": grouped["covered"].sum().astype(int),
            }
        )
        .reset_index()
        .rename(columns={"origin": "source family"})
    )
    loso = float(rows["abs_error"].median())
    ctx.headline["published_loso_median_error"] = loso
    ctx.headline["published_loso_coverage"] = float(covers.mean())
    ctx.figure(
        "published runs: leave-one-source-out median |error| (no term fitted to any source, "
        "so it equals the median)",
        theory=f"≤ {format_percent(LOSO_BOUND)}",
        source=HONEST,
        model=format_percent(loso),
    )
    share, covered = float(covers.mean()), int(covers.sum())
    detail = prose(
        __package__, "covered_detail", covered=covered, rows=len(rows), share=format_percent(share)
    )
    claim = "each source's rows fall inside the 90% interval the other sources give them"
    ctx.finding(claim, holds=share >= 0.8, detail=detail)
    text = prose(
        __package__,
        "per_source",
        families=rows["origin"].nunique(),
        sources=rows["source"].nunique(),
        loso=format_percent(loso),
        table=markdown_table(table, numparse=False),
    )
    return text, covered


def _plot(ctx: Context, rows: pd.DataFrame) -> str:
    values = pd.concat(
        [pd.to_numeric(rows[c], errors="coerce") for c in ("published", "predicted")]
    )
    values = values[values.map(math.isfinite) & (values > 0)]
    if values.empty:  # nothing a log scale can place
        return "(no positive published or predicted figure to plot)"
    fig, axes = new_figure(6.0, 5.0)
    ax = axes[0]
    for label, group in rows.groupby("origin", sort=False):
        ax.scatter(group["published"], group["predicted"], label=str(label)[:40], s=14)
    low, high = float(values.min()) * 0.8, float(values.max()) * 1.2
    ax.plot([low, high], [low, high], "k--", label="predicted = published")
    ax.plot([low, high], [0.75 * low, 0.75 * high], "k:", lw=0.8, label="±25%")
    ax.plot([low, high], [1.25 * low, 1.25 * high], "k:", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("published (source's metric)")
    ax.set_ylabel("simulator (model output)")
    ax.legend(fontsize=6)
    return ctx.plot(fig, "predicted_vs_published", "simulator vs published throughput, by source")


def scaling_series(ctx: Context) -> str | None:
    """Scaling series

    Published rows of one model, cluster, sequence, micro-batch and tp·pp layout at three
    or more data-parallel sizes: how the metric falls as DP grows, published against
    predicted. The decline is the value at the smallest DP minus the value at the largest,
    in points of MFU (or in % of the first value for other metrics)."""
    rows = _rows(ctx, "published")
    if rows.empty or not set(SERIES_KEYS) <= set(rows.columns):
        return None
    out, gaps = [], []
    for key, group in rows.groupby(list(SERIES_KEYS), sort=False):
        if group["dp"].nunique() < 3:
            continue
        group = group.sort_values("dp")
        first, last = group.iloc[0], group.iloc[-1]
        mfu = str(key[-1]).startswith("MFU")
        published, predicted = (
            (float(first[c]) - float(last[c])) * (100.0 if mfu else 100.0 / float(first[c]))
            for c in ("published", "predicted")
        )
        gap = abs(predicted - published)
        gaps.append(gap)
        unit = "points" if mfu else "% of the first"
        out.append(
            {
                "series": f"{key[1]} on {key[2]}, s = {format_count(key[3])}, "
                f"b = {format_count(key[4])}",
                "DP": " → ".join(format_count(v) for v in group["dp"]),
                "published": " → ".join(_fmt(v) for v in group["published"]),
                "simulator": " → ".join(_fmt(v) for v in group["predicted"]),
                "decline, published": f"{published:.1f} {unit}",
                "decline, simulator": f"{predicted:.1f} {unit}",
                "gap": f"{gap:.1f}",
            }
        )
    if not out:
        return None
    worst = max(gaps)
    ctx.headline["scaling_series_worst_gap"] = worst
    ctx.figure(
        "scaling series: |predicted − published| decline of MFU as DP grows (points)",
        theory=f"≤ {SERIES_BOUND:.0f} points",
        source=HONEST,
        model=f"worst {worst:.1f} over {len(gaps)} series",
    )
    ctx.finding(
        f"the predicted decline with DP matches the published one within "
        f"{SERIES_BOUND:.0f} points in every series",
        holds=worst <= SERIES_BOUND,
        detail=f"worst gap {worst:.1f} over {len(gaps)} series",
    )
    return markdown_table(pd.DataFrame(out), numparse=False)


REPORT = Report(
    title="At scale: the simulator against the lecture's figures and published runs",
    intro=prose(__package__, "intro"),
    sections=(lecture, published, scaling_series),
    targets=(PUBLISHED_TARGET, SUMMIT_TARGET, GPT3_TARGET),
)
