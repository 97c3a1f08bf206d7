"""The `parallelism_comparison` report: the lecture's comparison of DP, TP and PP, measured.

Sections: what was measured on what, the lecture's table per world size with every
ordering it claims checked (`ctx.finding`: the index lists those that do not hold),
memory, communication and utilization in detail with their plots, and each layout's
errors against single-device training. The skeleton (`bench.report.skeleton`) writes the
setup, targets, correctness totals and failed cells. Reads results only: never `impls`.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from bench.experiments.parallelism_comparison.plots import (
    AXIS_COLOURS,
    PARTS,
    ordered,
    plot_comm,
    plot_memory,
    plot_utilization,
)
from bench.experiments.parallelism_comparison.tables import (
    BUBBLE_SOURCE,
    count,
    figures_and_headline,
    lecture_rows,
    number,
    orderings,
    ratio,
    why_text,
)
from bench.report import (
    Context,
    Report,
    Target,
    format_bytes,
    format_percent,
    format_ratio,
    format_seconds,
    markdown_table,
    prose,
)

__all__ = ["REPORT"]

_prose = partial(prose, __package__)  # this experiment's prose.md.j2 macros


def measured_on(ctx: Context) -> str | None:
    """What was measured, on what

    - **memory per rank**: the bytes the fullest rank holds — model states (weights,
      gradients, AdamW's moments, counted off the tensors it holds) plus the peak of its
      saved activations (autograd's saved tensors, counted by the pipeline executor).
    - **communication per step**: bytes the busiest rank sends in one training step,
      counted by the mesh's dp, pp and tp communicators, exactly.
    - **utilization** = Σ_r compute_r / (N · step time): the share of the step's rank-time
      spent computing, not communicating or waiting for a peer (pipeline bubbles
      included). Compute leaves out the time in communication rounds and the collectives'
      own work between their rounds (the clone Megatron's f/g make, the ring's slicing
      and additions: measured thread CPU per TP all-reduce). For DP the only non-compute
      time is the gradient all-reduce, for TP the all-reduces inside every layer, for PP
      the bubble and the transfers. *Replayed*: the executed plan on its dependency
      graph, each compute action at its thread CPU time measured while the host's ranks
      computed one at a time (the median over the stage's ranks, micro-batches and
      profiled steps: they all do the same work), each round of communication at α +
      β·bytes with α, β measured between two otherwise idle ranks — as if every rank had
      its own device and link. *Wall clock*: each rank's own step less its time in rounds
      and its all-reduces' own work, on this host's clock. With more ranks than cores it
      is distorted both ways: a rank descheduled mid-compute looks busy, one waiting for
      a descheduled peer looks idle.
    - **step time**: wall clock (slowest rank, median of the timed steps) and the
      replayed makespan."""
    first = ctx.ok.iloc[0]
    keys = ("n_layers", "d_model", "n_heads", "seq_len", "vocab_size")
    return _prose(
        "measured_on",
        model=", ".join(f"{k}={count(first[k])}" for k in keys if k in first),
        psi=count(first["params"], grouped=True),
        batch=count(first["batch_size"]),
        microbatches=count(first["microbatches"]),
        schedule=first["schedule"],
        layouts=", ".join(
            f"{r.layout} (N={count(r.world_size)})" for r in ordered(ctx.ok).itertuples()
        ),
    )


def lecture_table(ctx: Context) -> str | None:
    """The lecture's table, measured

    Per world size, each layout's measured utilization, memory and communication beside
    the lecture's adjective for its strategy; below each table, every ordering the
    adjectives claim between the pure layouts, checked (the index lists those that do
    not hold)."""
    if ctx.ok.empty:
        ctx.headline["by_world_size"] = {}
        return None
    parts = []
    for n, rows in ordered(ctx.ok).groupby("world_size", sort=True):
        checks = orderings(ctx, int(n))
        table = markdown_table(lecture_rows(ctx.ok, int(n), rows))
        parts.append(f"### N = {int(n)} ranks\n\n{table}\n\n" + "\n".join(checks))
    figures_and_headline(ctx)
    return "\n\n".join([*parts, why_text(ctx.ok)])


def memory(ctx: Context) -> str | None:
    """Memory per rank

    Theory (one model copy cut k = pp·tp ways, Megatron-LM, Shoeybi et al. 2019, §3):
    model states are 16 bytes per parameter (fp32 weight, gradient and AdamW's two
    moments), so DP holds 16Ψ on every rank and a layout that cuts one copy k ways holds
    16Ψ/k per rank on average. TP keeps its LayerNorms and position embedding replicated,
    PP's end stages hold the embedding and LM head: mean ÷ theory shows what that costs.
    The parts are the fullest rank's."""
    if ctx.ok.empty:
        return None
    rows = ordered(ctx.ok)
    table = pd.DataFrame(
        {
            "N": rows["world_size"].map(count),
            "layout": rows["layout"],
            **{label: rows[c].map(format_bytes) for c, label in PARTS.items()},
            "model states (max rank)": rows["model_state_bytes"].map(format_bytes),
            "model states (mean)": rows["model_state_bytes_mean"].map(format_bytes),
            "theory 16Ψ/k": rows["theory_model_state_bytes"].map(format_bytes),
            "mean ÷ theory": ratio(
                rows["model_state_bytes_mean"], rows["theory_model_state_bytes"]
            ).map(format_ratio),
        }
    )
    return plot_memory(ctx, ctx.ok) + "\n\n" + markdown_table(table)


def communication(ctx: Context) -> str | None:
    """Communication per step

    Counted bytes sent per step by the busiest rank on each axis, beside the papers'
    counts: DP one ring all-reduce of the rank's gradients, 2(d−1)/d·(Ψ_rank + 1)·4 bytes;
    TP Megatron's all-reduces of the (b, s, h) activations, two per block forward and two
    backward, plus the vocab-parallel embedding, LM head and cross-entropy (Shoeybi et al.
    2019, §3), each 2(t−1)/t of its buffer; PP one activation forward and one gradient
    backward per micro-batch and stage boundary (GPipe). The counts add the step's
    barrier and loss broadcast, a few bytes."""
    if ctx.ok.empty:
        return None
    rows = ordered(ctx.ok)
    table = pd.DataFrame(
        {
            "N": rows["world_size"].map(count),
            "layout": rows["layout"],
            **{f"{a} (counted)": rows[f"comm_bytes_{a}"].map(format_bytes) for a in AXIS_COLOURS},
            **{
                f"{a} (predicted)": rows[f"predicted_comm_bytes_{a}"].map(format_bytes)
                for a in AXIS_COLOURS
            },
            "rounds": rows["comm_rounds_per_step"].map(count),
        }
    )
    return plot_comm(ctx, ctx.ok) + "\n\n" + markdown_table(table)


def utilization(ctx: Context) -> str | None:
    """Utilization

    Bars: the replayed step of each layout split into compute, communication rounds a
    rank must sit through (TP's all-reduces inside every layer, DP's all-reduce after the
    backward) and waiting (pipeline bubbles, transfer latency, a slower stage); the
    compute share is the replayed utilization. Bound: GPipe (Huang et al. 2019), §2.3:
    M/(M+pp−1), for the pipeline alone: communication lowers the replay below it, unequal
    stages too, while the step's work after the pipeline (the optimizer, which has no
    bubble) can lift it a little above. The table gives the replayed step per rank (means
    over ranks): compute; communication as latency — α per round, measured as the fastest
    exchange of 4 bytes between two otherwise idle ranks, plus each TP all-reduce's own
    work between its rounds (the clone its f/g make, the ring's slicing and additions,
    measured as thread CPU) — and as bytes at β, measured from a 1 MiB exchange; and the
    rest, waiting."""
    if ctx.ok.empty:
        return None
    rows = ordered(ctx.ok)
    step = rows["replayed_step_time_s"]
    waiting = step - rows["replayed_compute_s"]
    waiting -= rows["replayed_comm_latency_s"] + rows["replayed_comm_bandwidth_s"]
    waiting = waiting.where(waiting > 1e-9 * step, 0.0)  # rounding
    table = pd.DataFrame(
        {
            "N": rows["world_size"].map(count),
            "layout": rows["layout"],
            "replayed step": step.map(format_seconds),
            "compute": rows["replayed_compute_s"].map(format_seconds),
            "comm: latency": rows["replayed_comm_latency_s"].map(format_seconds),
            "comm: bytes": rows["replayed_comm_bandwidth_s"].map(format_seconds),
            "waiting": waiting.map(format_seconds),
            "rounds": rows["comm_rounds_per_step"].map(count),
            "α per round": rows["link_alpha_s"].map(format_seconds),
            "β per MiB": (rows["link_beta_s_per_byte"] * 2**20).map(format_seconds),
            "TP all-reduce's own work": [
                format_seconds(v) if t > 1 else "—"
                for v, t in zip(rows["tp_call_cpu_s"], rows["tp"], strict=True)
            ],
        }
    )
    text = plot_utilization(ctx, ctx.ok) + "\n\n" + markdown_table(table)
    return text + _tp_latency_text(rows)


def _tp_latency_text(rows: pd.DataFrame) -> str:
    """What TP's communication costs on this host, from its largest pure-TP row."""
    tp = rows[rows["strategy"] == "TP"]
    if tp.empty:
        return ""
    t = tp.iloc[-1]
    comm = number(t["replayed_comm_latency_s"]) + number(t["replayed_comm_bandwidth_s"])
    latency = format_percent(ratio(t["replayed_comm_latency_s"], comm))
    return "\n\n" + _prose(
        "tp_latency",
        ranks=count(t["world_size"]),
        comm=format_seconds(comm),
        step=format_seconds(t["replayed_step_time_s"]),
        rounds=count(t["comm_rounds_per_step"]),
        latency=latency,
        alpha=format_seconds(t["link_alpha_s"]),
        own_work=format_seconds(t["tp_call_cpu_s"]),
    )


def errors(ctx: Context) -> str | None:
    """Errors against single-device training

    Each layout's losses, parameters and last gradients after its training steps against
    single-device AdamW on the whole batch, on the worst rank: update error ‖p − p_ref‖ /
    ‖p_ref − p_start‖; gradient error ‖g − g_ref‖ / ‖g_ref‖, which catches a wrongly
    scaled gradient Adam's step would hide."""
    if ctx.ok.empty:
        return None
    rows = ordered(ctx.ok)

    def sig(column: str, digits: int = 2):
        return rows[column].map(lambda v: f"{v:.{digits}g}")

    table = pd.DataFrame(
        {
            "N": rows["world_size"].map(count),
            "layout": rows["layout"],
            "loss": sig("loss", 6),
            "loss error (relative)": sig("loss_error"),
            "update error (relative)": sig("update_error"),
            "gradient error (relative)": sig("grad_error"),
            "max param diff": sig("max_param_diff"),
            "wrong": rows["wrong"].map(count),
        }
    )
    return markdown_table(table)


def _column(df: pd.DataFrame, name: str) -> pd.Series:
    if name not in df.columns:
        return pd.Series(np.nan, index=df.index)
    return pd.to_numeric(df[name], errors="coerce")


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """The columns the targets read: counted traffic's distance from the papers' count,
    model states against one copy cut k ways, PP's utilization against its bound."""
    counted, predicted = (
        _column(df, "comm_bytes_per_step"),
        _column(df, "predicted_comm_bytes_per_step"),
    )
    alone = (_column(df, "world_size") == 1) & (counted == 0) & (predicted == 0)
    df["comm_count_error"] = ratio((counted - predicted).abs(), predicted).mask(alone, 0.0)
    states = _column(df, "model_state_bytes_mean")
    df["model_state_vs_theory"] = ratio(states, _column(df, "theory_model_state_bytes"))
    df["util_vs_bound"] = ratio(_column(df, "util_replayed"), _column(df, "util_theory"))
    return df


TARGETS = (
    Target(
        figure="bytes sent per step: counted vs the papers' count, relative gap",
        column="comm_count_error",
        op="<=",
        bound=1e-3,
        source="Megatron-LM §3, GPipe, ring 2(n−1)/n; the barrier and loss add a few bytes",
        fmt=lambda v: f"{100 * v:.2g}%",
    ),
    Target(
        figure="model states per rank (mean) ÷ one copy cut k = pp·tp ways (16Ψ/k)",
        column="model_state_vs_theory",
        op="<=",
        bound=1.1,
        source="PTD-P §2; TP's replicated LayerNorms, PP's end stages: a few percent",
    ),
    Target(
        figure="pure pipelines (PP): utilization (replayed) ÷ bubble bound M/(M+P−1)",
        column="util_vs_bound",
        op=">=",
        bound=0.85,
        where={"strategy": "PP"},
        source=f"{BUBBLE_SOURCE}; the 2(P−1) transfers at α + β·bytes on its critical "
        "path and the end stages' extra work: 4–10% on this host's links",
    ),
)

REPORT = Report(
    title="Parallelism comparison: DP, TP, PP and their 2D/3D compositions, measured",
    intro=_prose("intro"),
    sections=(measured_on, lecture_table, memory, communication, utilization, errors),
    targets=TARGETS,
    prepare=prepare,
    correctness=_prose("correctness"),
)
