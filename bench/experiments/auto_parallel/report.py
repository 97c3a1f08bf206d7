"""The `auto_parallel` report: the planner's best plans, why the others lose, and where
each plan's predicted step time goes. Everything here is the simulator's output."""

from __future__ import annotations

import pandas as pd

from bench.experiments.auto_parallel.plots import (
    BREAKDOWN,
    breakdown_figure,
    memory_figure,
    mfu_figure,
    plan_label,
)
from bench.report import (
    Context,
    Report,
    format_count,
    format_percent,
    format_seconds,
    markdown_table,
    prose,
)

__all__ = ["REPORT"]

SOURCE = "impls.simulator on the hardware preset (inputs cited in impls/costmodel/presets.py)"


def _found(ok: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The rows of `ok` in list `kind` (best / rejected) that hold a plan, by GPUs and rank."""
    if ok.empty or "found" not in ok.columns:
        return ok.iloc[0:0]
    found = ok[(ok["list"] == kind) & ok["found"].astype(str).isin(["True", "true", "1"])]
    return found.sort_values(["gpus", "rank"])


def best_plans(ctx: Context) -> str | None:
    """Best plans per GPU count

    Ranked by predicted tokens per second; every column is a prediction of the simulator
    (compute from the GEMM-efficiency table, communication from α–β over the preset's
    links, the pipeline schedule replayed). `stage_layers` "equal" is equal slicing; a
    list is the Alpa-style slicing (embedding and LM head counted as layers). The 90%
    interval is what the simulator's residuals on the published runs (`at_scale`) say a
    run so predicted achieves; "within #1's interval" marks plans the residuals cannot
    tell apart from the best."""
    best = _found(ctx.ok, "best")
    if best.empty:
        return None
    best = best.assign(within_best=_within_best(best))
    table = pd.DataFrame(
        {
            "GPUs": best["gpus"],
            "rank": best["rank"],
            "plan": best.apply(plan_label, axis=1),
            "M": best["num_microbatches"],
            "stages": best["stage_layers"],
            "step": best["predicted_step_time_s"].map(format_seconds),
            "tokens/s": best["predicted_tokens_per_s"].map(lambda v: f"{v:,.0f}"),
            "TFLOP/s per GPU": best["predicted_tflops_per_gpu"].map(lambda v: f"{v:.0f}"),
            "MFU": best["predicted_mfu"].map(format_percent),
            "MFU 90% interval": best.apply(_mfu_interval, axis=1),
            "within #1's interval": best["within_best"].map({True: "yes", False: "no"}),
            "peak GB": best["predicted_peak_memory_gb"].map(lambda v: f"{v:.1f}"),
        }
    )
    for _, row in best[best["rank"] == 1].iterrows():
        model = prose(
            __package__,
            "best_plan",
            plan=plan_label(row),
            mfu=format_percent(row["predicted_mfu"]),
            interval=_mfu_interval(row),
            tflops=f"{row['predicted_tflops_per_gpu']:.0f}",
        )
        figure = f"best plan, {row['model']} on {int(row['gpus'])} × {row['hardware']}"
        ctx.figure(figure, theory="—", source=SOURCE, model=model)
    ctx.headline["best"] = best[best["rank"] == 1].to_dict("records")
    return markdown_table(table, numparse=False)


def _mfu_interval(row: pd.Series) -> str:
    if "predicted_mfu_low" not in row or pd.isna(row["predicted_mfu_low"]):
        return "—"
    return f"{format_percent(row['predicted_mfu_low'])}–{format_percent(row['predicted_mfu_high'])}"


def _within_best(best: pd.DataFrame) -> pd.Series:
    """Whether each plan's predicted throughput lies inside its GPU count's #1's interval."""
    if "predicted_tokens_per_s_low" not in best.columns:
        return pd.Series(False, index=best.index)
    first = best[best["rank"] == 1].set_index("gpus")["predicted_tokens_per_s_low"]
    floor = best["gpus"].map(first)
    return pd.to_numeric(best["predicted_tokens_per_s"]) >= pd.to_numeric(floor)


def rejected(ctx: Context) -> str | None:
    """Why the others lose

    The best plans the planner did not choose: those that do not fit in the device's
    memory, and those that fit but lose to the best, named by the term of the step-time
    breakdown that costs them most against it (bubble, or which communication)."""
    rows = _found(ctx.ok, "rejected")
    if rows.empty:
        return None
    table = pd.DataFrame(
        {
            "GPUs": rows["gpus"],
            "plan": rows.apply(plan_label, axis=1),
            "fits": rows["fits"],
            "peak GB": rows["predicted_peak_memory_gb"].map(lambda v: f"{v:.1f}"),
            "step": rows["predicted_step_time_s"].map(format_seconds),
            "why it loses": rows["reason"],
        }
    )
    return markdown_table(table, numparse=False)


def breakdown(ctx: Context) -> str | None:
    """Where the step time goes

    Compute, the pipeline bubble, the communication no computation hides (TP inside each
    layer, PP between stages, DP/ZeRO after the backward) and the optimizer, per plan."""
    rows = pd.concat([_found(ctx.ok, "best"), _found(ctx.ok, "rejected")])
    rows = rows[rows["fits"].astype(bool)] if not rows.empty else rows
    if rows.empty:
        return None
    columns = [c for c, _ in BREAKDOWN]
    rows = rows.dropna(subset=columns)
    alt = "stacked predicted step time per plan"
    return ctx.plot(breakdown_figure(rows), "step_time_breakdown", alt)


def mfu_vs_gpus(ctx: Context) -> str | None:
    """MFU against GPU count

    The best plan's model FLOPs utilisation (model FLOPs ÷ step time ÷ GPUs ÷ peak, PaLM
    App. B) as the cluster grows at a fixed global batch."""
    best = _found(ctx.ok, "best")
    best = best[best["rank"] == 1]
    if best.empty:
        return None
    return ctx.plot(mfu_figure(best), "mfu_vs_gpus", "predicted MFU of the best plan vs GPUs")


def memory(ctx: Context) -> str | None:
    """Memory against plan

    Predicted peak memory per device (model states under the plan's ZeRO stage, the
    activations of the micro-batches its schedule holds, the end stages' logits) beside the
    device's memory. When no plan fits, the smallest peak found is stated instead."""
    rows = pd.concat([_found(ctx.ok, "best"), _found(ctx.ok, "rejected")])
    ok = ctx.ok
    if ok.empty:
        return None
    device = float(ok["device_memory_gb"].iloc[0])
    text = []
    for gpus, sub in ok.groupby("gpus"):
        if _found(sub, "best").empty:
            gb = f"{float(sub['smallest_memory_gb'].min()):.1f}"
            line = prose(__package__, "no_plan_fits", gpus=gpus, device=f"{device:g}", smallest=gb)
            text.append(line)
    if not rows.empty:
        alt = "predicted peak memory per plan"
        text.append(ctx.plot(memory_figure(rows, device), "memory_vs_plan", alt))
    return "\n".join(text) or None


def against_published(ctx: Context) -> str | None:
    """Against published runs of this model

    Each published run of this model on this preset (`at_scale`'s rows), priced in its own
    plan beside the number its source reports, and the planner's best plan at the same
    GPU count. Where the best plan promises more than the run achieved, the step-time
    terms per token say which modelled term makes it better: the term whose seconds per
    token shrink most from the run's plan to the best plan."""
    ok = ctx.ok
    if ok.empty or "published" not in set(ok["list"]):
        return None
    runs = _found(ok, "published")
    best = _found(ok, "best")
    best = best[best["rank"] == 1].set_index("gpus")
    rows = []
    for _, run in runs.iterrows():
        first = best.loc[run["gpus"]] if run["gpus"] in best.index else None
        term, gain = _better_term(run, first) if first is not None else ("—", 0.0)
        best_mfu = float(first["predicted_mfu"]) if first is not None else float("nan")
        rows.append(
            {
                "run": run["run"],
                "GPUs": format_count(run["gpus"]),
                "its plan": plan_label(run),
                "batch": format_count(run["global_batch"]),
                "published": f"{run['published_value']:.3g} ({run['published_metric']})",
                "simulator, its plan": f"{run['predicted_value']:.3g}",
                "MFU, its plan (90%)": f"{format_percent(run['predicted_mfu'])} "
                f"({_mfu_interval(run)})",
                "best plan MFU": format_percent(best_mfu) if first is not None else "—",
                "what makes the best plan better (share of the run's step per token)": term,
            }
        )
        if first is not None and str(run["published_metric"]) == "MFU":
            ratio = best_mfu / float(run["published_value"])
            claim = prose(
                __package__, "published_claim", gpus=format_count(run["gpus"]), run=run["run"]
            )
            detail = prose(
                __package__,
                "published_detail",
                best=format_percent(best_mfu),
                published=format_percent(run["published_value"]),
                ratio=f"{ratio:.2f}",
                terms=term,
            )
            ctx.finding(claim, holds=ratio <= 1.10 or gain > 0, detail=detail)
    return markdown_table(pd.DataFrame(rows), numparse=False)


def _better_term(run: pd.Series, best: pd.Series) -> tuple[str, float]:
    """The breakdown terms whose seconds per token drop most from `run`'s plan to `best`
    (the two largest, named with their drop as a share of the run's step per token), and
    the largest drop."""

    def per_token(row: pd.Series, column: str) -> float:
        tokens = float(row["predicted_tokens_per_s"]) * float(row["predicted_step_time_s"])
        return float(row[column]) / tokens

    step = per_token(run, "predicted_step_time_s")
    drops = [((per_token(run, c) - per_token(best, c)) / step, label) for c, label in BREAKDOWN]
    drops = sorted(drops)[::-1]
    text = ", ".join(f"{label} {drop:+.1%}" for drop, label in drops[:2])
    return text, drops[0][0]


def search_time(ctx: Context) -> str | None:
    """Search time

    Wall-clock seconds of the planner's whole search per GPU count on this host, and how
    many plans it priced (this one is measured)."""
    ok = ctx.ok
    if ok.empty:
        return None
    per = ok.groupby("gpus").agg(search_s=("search_s", "max"), evaluated=("evaluated", "max"))
    table = pd.DataFrame(
        {
            "GPUs": per.index,
            "plans priced": per["evaluated"].map(format_count),
            "search time": per["search_s"].map(format_seconds),
        }
    )
    ctx.headline["search_s"] = {int(k): float(v) for k, v in per["search_s"].items()}
    return markdown_table(table, numparse=False)


REPORT = Report(
    title="Auto-parallel: the best plan for a model on a GPU cluster (predicted)",
    intro=prose(__package__, "intro"),
    sections=(best_plans, rejected, against_published, breakdown, mfu_vs_gpus, memory, search_time),
)
