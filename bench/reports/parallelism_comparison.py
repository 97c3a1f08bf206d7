"""Report for `parallelism_comparison`: the lecture's comparison of DP, TP and PP, measured.

The lecture (seeds/004, "Comparing Different Parallelization Strategies") describes each
strategy in adjectives: data parallelism has high utilization, high memory cost and low
communication; tensor parallelism balances utilization with lower memory but higher
communication; pipeline parallelism has low utilization and memory with medium
communication; 2D and 3D parallelism ("Hybrid Parallelism") combine them (Megatron-LM
PTD-P, Narayanan et al. 2021). This writer puts the measured number beside each adjective,
per world size, checks the orderings the adjectives claim, and draws memory per rank,
communication per step and the replayed step's time split.

Utilization is Σ_r compute_r / (N · step time): the share of the step's rank-time spent
computing rather than in communication rounds or waiting (pipeline bubbles included).
*Replayed* prices compute at CPU time measured with the host to one rank at a time and
communication at this host's measured α + β·bytes, as if every rank had its own device;
*wall clock* is this host's, where ranks share cores. Theory is labelled with its source.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MultipleLocator

from bench.reports import (
    failed_cells_markdown,
    failures_list,
    figure_row,
    format_bytes,
    format_ratio,
    format_seconds,
    markdown_table,
    new_figure,
    ok_rows,
    run_context,
    save_figure,
    to_jsonable,
    write_headline,
    write_text_atomic,
)

__all__ = ["LECTURE", "write_report"]

LECTURE_SOURCE = 'lecture 004, "Comparing Different Parallelization Strategies"'
LECTURE = {  # strategy -> the lecture's words for utilization, memory, communication
    "DP": ("high", "high", "low"),
    "TP": ("balanced", "lower", "higher"),
    "PP": ("low", "low", "medium"),
    "2D": ("—", "—", "—"),
    "3D": ("—", "—", "—"),
}
ORDER = tuple(LECTURE)
BUBBLE_SOURCE = "GPipe (Huang et al. 2019), §2.3: M/(M+pp−1)"
MEMORY_SOURCE = "one model copy cut k = pp·tp ways (Megatron-LM, Shoeybi et al. 2019, §3)"
COMM_SOURCE = "Megatron-LM §3 (TP) vs one ring all-reduce of the gradients (DP)"
PARTS = {"param_bytes": "weights", "grad_bytes": "gradients", "optim_bytes": "AdamW moments",
         "activation_peak_bytes": "saved activations (peak)"}  # fmt: skip
PART_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#8172B3")
AXIS_COLOURS = {"dp": "#4C72B0", "pp": "#55A868", "tp": "#C44E52"}


def _pct(value: Any) -> str:
    return "—" if value is None or not math.isfinite(float(value)) else f"{100 * value:.1f}%"


def _ordered(rows: pd.DataFrame) -> pd.DataFrame:
    rank = rows["strategy"].map(lambda s: ORDER.index(s) if s in ORDER else len(ORDER))
    return rows.assign(_order=rank).sort_values(["world_size", "_order", "layout"])


def _pure(rows: pd.DataFrame, n: int, strategy: str) -> pd.Series | None:
    """The layout that is `strategy` alone on all `n` ranks (e.g. dp = n), if it ran."""
    axis = strategy.lower()
    hit = rows[(rows["world_size"] == n) & (rows["strategy"] == strategy) & (rows[axis] == n)]
    return None if hit.empty else hit.iloc[0]


def _setup_section(df: pd.DataFrame, ok: pd.DataFrame) -> str:
    first = ok.iloc[0]
    model = ", ".join(f"{k}={int(first[k])}" for k in
                      ("n_layers", "d_model", "n_heads", "seq_len", "vocab_size") if k in ok)  # fmt: skip
    layouts = ", ".join(f"{r.layout} (N={int(r.world_size)})" for r in _ordered(ok).itertuples())
    return (
        "## What was measured, on what\n\n"
        f"One GPT ({model}; Ψ = {int(first['params']):,} parameters) trained with AdamW "
        f"(fp32) on one global batch of {int(first['batch_size'])} sequences, split into "
        f"{int(first['microbatches'])} micro-batches per replica, schedule "
        f"`{first['schedule']}`, on the layouts {layouts}. Every layout is "
        "`impls.hybrid.HybridTrainer` on a `Mesh` (a degree of 1 leaves an axis out). "
        f"{run_context(df)}\n\n"
        "- **memory per rank**: the bytes the fullest rank holds — model states (weights, "
        "gradients, AdamW's moments, counted off the tensors it holds) plus the peak of "
        "its saved activations (autograd's saved tensors, counted by the pipeline "
        "executor).\n"
        "- **communication per step**: bytes the busiest rank sends in one training step, "
        "counted by the mesh's dp, pp and tp communicators, exactly.\n"
        "- **utilization** = Σ_r compute_r / (N · step time): the share of the step's "
        "rank-time spent computing, not communicating or waiting for a peer (pipeline "
        "bubbles included). Compute leaves out the time in communication rounds and the "
        "collectives' own work between their rounds (the clone Megatron's f/g make, the "
        "ring's slicing and additions: measured thread CPU per TP all-reduce). For DP the "
        "only non-compute time is the gradient all-reduce, for TP the all-reduces inside "
        "every layer, for PP the bubble and the transfers. *Replayed*: the executed plan "
        "on its dependency graph, each compute action at its thread CPU time measured while "
        "the host's ranks computed one at a time (the median over the stage's ranks, "
        "micro-batches and profiled steps: they all do the same work), each round of "
        "communication at α + β·bytes with α, β measured between two otherwise idle ranks "
        "— as if every rank had its own device and link. *Wall clock*: each rank's own "
        "step less its time in rounds and its all-reduces' own work, on this host's clock. "
        "With more ranks than cores it is distorted both ways: a rank descheduled "
        "mid-compute looks busy, one waiting for a descheduled peer looks idle.\n"
        "- **step time**: wall clock (slowest rank, median of the timed steps) and the "
        "replayed makespan.\n"
    )


def _verdict(rows: pd.DataFrame, n: int, column: str, order: list[str], what: str) -> str:
    """Whether `column` of the pure layouts at `n` ranks falls in `order` (largest first)."""
    present = [(s, _pure(rows, n, s)) for s in order]
    present = [(s, r) for s, r in present if r is not None]
    if len(present) < 2:
        return f"- {what}: fewer than two of DP/TP/PP ran at N = {n}."
    values = [(s, float(r[column])) for s, r in present]
    measured = sorted(values, key=lambda sv: -sv[1])
    agrees = [s for s, _ in measured] == [s for s, _ in values]
    listing = " > ".join(f"{s} {_fmt(column, v)}" for s, v in measured)
    claim = " > ".join(s for s, _ in values)
    return f"- {what}: measured {listing}; the lecture's {claim} {'holds' if agrees else '**does not hold**'}."


def _fmt(column: str, value: float) -> str:
    return _pct(value) if column.startswith("util") else format_bytes(value)


def _table_section(ok: pd.DataFrame) -> tuple[str, list[str]]:
    parts = ["## The lecture's table, measured\n"]
    verdicts: list[str] = []
    for n, rows in _ordered(ok).groupby("world_size", sort=True):
        dp = _pure(ok, int(n), "DP")

        def vs_dp(rows, column, dp=dp):
            return rows[column].map(lambda v: "—" if dp is None else format_ratio(v / dp[column]))

        words = rows["strategy"].map(lambda s: LECTURE.get(s, ("—",) * 3))
        table = pd.DataFrame({
            "strategy": rows["strategy"], "layout": rows["layout"],
            "utilization (replayed)": rows["util_replayed"].map(_pct),
            "utilization (wall clock)": rows["util_wall"].map(_pct),
            "bubble bound": rows["util_theory"].map(_pct),
            "lecture: utilization": words.map(lambda w: w[0]),
            "memory per rank": rows["memory_per_rank_bytes"].map(format_bytes),
            "model states": rows["model_state_bytes"].map(format_bytes),
            "model states ÷ DP": vs_dp(rows, "model_state_bytes"),
            "saved activations": rows["activation_peak_bytes"].map(format_bytes),
            "lecture: memory": words.map(lambda w: w[1]),
            "communication per step": rows["comm_bytes_per_step"].map(format_bytes),
            "comm ÷ DP": vs_dp(rows, "comm_bytes_per_step"),
            "lecture: communication": words.map(lambda w: w[2]),
            "step time (wall)": rows["step_time_s"].map(format_seconds),
            "step time (replayed)": rows["replayed_step_time_s"].map(format_seconds),
            "wrong": rows["wrong"].astype(int),
        })  # fmt: skip
        checks = [
            _verdict(ok, int(n), "util_replayed", ["DP", "TP", "PP"], "utilization (replayed)"),
            _verdict(ok, int(n), "model_state_bytes", ["DP", "TP"], "model states per rank"),
            _verdict(ok, int(n), "model_state_bytes", ["DP", "PP"], "model states per rank"),
            _verdict(ok, int(n), "memory_per_rank_bytes", ["DP", "TP"], "memory per rank"),
            _verdict(ok, int(n), "memory_per_rank_bytes", ["DP", "PP"], "memory per rank"),
            _verdict(ok, int(n), "comm_bytes_per_step", ["TP", "PP", "DP"], "communication per step"),
        ]  # fmt: skip
        verdicts += checks
        parts.append(
            f"### N = {int(n)} ranks\n\n{markdown_table(table)}\n\n" + "\n".join(checks) + "\n"
        )
    parts.append(_why_text(ok))
    return "\n".join(parts), verdicts


def _why_text(ok: pd.DataFrame) -> str:
    """What the counts say about the orderings, with this model's numbers."""
    r = ok.iloc[0]
    psi, layers, h = float(r["params"]), int(r["n_layers"]), int(r["d_model"])
    tokens = int(r["batch_size"]) * int(r["seq_len"])  # B·s of the global batch
    return (
        "\n**Which orderings are properties of the math.** The lecture's adjectives come from "
        "its comparison slide (2D and 3D have none there). *Model states*: TP and PP keep one "
        "copy of the model cut k ways, DP a whole copy on every rank — that ordering holds "
        "for any model. *Saved activations* scale with the sequences a rank carries through "
        "its layers: a DP rank one micro-batch of B/(d·M) sequences; a TP rank one of B/M "
        "sequences through every block, only the heads and the MLP's inner width split t ways "
        "(LayerNorm inputs and the residual stream stay whole; Korthikanti et al. 2022, "
        "arXiv 2205.05198, §4.1); a PP rank up to min(p, M) micro-batches of B/M sequences "
        "through L/p blocks under 1F1B (all M under GPipe). With one global batch for all "
        "layouts, TP and PP can therefore hold more activations per rank than DP; their "
        "saving is the model states. *Communication*: per step a DP rank sends a ring "
        "all-reduce of the gradients, 2(d−1)/d·Ψ elements; a TP rank 2(t−1)/t·4·L·B·s·h "
        "(four all-reduces of the activations per block, Megatron-LM §3); an interior PP rank "
        "2·B·s·h (one activation forward, one gradient backward; GPipe). So TP ÷ DP ≈ "
        f"4·L·B·s·h / Ψ = {4 * layers * tokens * h / psi:.2f} for this model "
        f"(L = {layers}, B·s = {tokens}, h = {h}, Ψ = {int(psi):,}) and PP ÷ DP ≈ "
        f'B·s·h / ((d−1)/d·Ψ) = {tokens * h / psi:.2f}·d/(d−1): the lecture\'s "TP higher" '
        'holds when B·s > Ψ/(4·L·h) ≈ 3h, its "PP medium, DP low" only when a whole '
        "batch's activations outweigh the gradients, B·s·h > (d−1)/d·Ψ. *Utilization* is "
        "measured, not derived: see below for what TP's communication costs on this host.\n"
    )


def _bars(ax, rows: pd.DataFrame, parts: list[tuple[str, str, str]]) -> np.ndarray:
    """Stacked bars of `rows`' columns `parts` = [(column, label, colour)], one per layout."""
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for column, _, colour in parts:
        values = rows[column].to_numpy(dtype=float)
        ax.bar(x, values, bottom=bottom, color=colour, width=0.7)
        bottom += values
    ax.set_xticks(x, rows["layout"], rotation=35, ha="right", fontsize=9)
    return x


def _bytes_axis(ax, top: float) -> None:
    """Ticks at multiples of a power of two (8 MiB, 16 MiB, …), about five of them."""
    step = 2 ** max(0, math.floor(math.log2(top / 4))) if top > 0 else 1
    ax.yaxis.set_major_locator(MultipleLocator(step))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))


def _plot(ok: pd.DataFrame, path: Path, kind: str) -> None:
    sizes = sorted(int(n) for n in ok["world_size"].unique())
    fig, axes = new_figure(4.2 * len(sizes) + 1.5, 4.2, 1, len(sizes))
    for ax, n in zip(axes, sizes, strict=True):
        rows = _ordered(ok[ok["world_size"] == n])
        if kind == "memory":
            parts = [(c, label, col) for (c, label), col in zip(PARTS.items(), PART_COLOURS,
                                                                  strict=True)]  # fmt: skip
            x = _bars(ax, rows, parts)
            ax.scatter(x, rows["theory_model_state_bytes"], marker="D", color="black", zorder=5)
            _bytes_axis(ax, float(rows["memory_per_rank_bytes"].max()))
        elif kind == "comm":
            parts = [(f"comm_bytes_{a}", a, c) for a, c in AXIS_COLOURS.items()]
            x = _bars(ax, rows, parts)
            ax.scatter(
                x, rows["predicted_comm_bytes_per_step"], marker="D", color="black", zorder=5
            )
            _bytes_axis(ax, float(rows["comm_bytes_per_step"].max()))
        else:
            rows = rows.assign(
                wait=1 - rows["util_replayed"] - rows["comm_fraction_replayed"]
            ).rename(columns={"util_replayed": "compute", "comm_fraction_replayed": "comm"})
            parts = [("compute", "", "#55A868"), ("comm", "", "#C44E52"), ("wait", "", "#BBBBBB")]
            x = _bars(ax, rows, parts)
            ax.scatter(x, rows["util_wall"], marker="o", color="black", zorder=5)
            ax.scatter(x, rows["util_theory"], marker="_", s=400, color="black", zorder=5)
            ax.set_ylim(0, 1.05)
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:.0f}%"))
        ax.set_title(f"N = {n} ranks")
    if kind == "memory":
        handles = [Patch(color=c, label=label) for label, c in zip(PARTS.values(), PART_COLOURS,
                                                                   strict=True)]  # fmt: skip
        handles.append(Line2D([], [], marker="D", color="black", linestyle="",
                              label="theory: 16Ψ/k model states (mean per rank)"))  # fmt: skip
        title = "Memory per rank (the fullest rank), measured"
    elif kind == "comm":
        handles = [Patch(color=c, label=f"{a} axis") for a, c in AXIS_COLOURS.items()]
        handles.append(Line2D([], [], marker="D", color="black", linestyle="",
                              label="predicted (papers' counts)"))  # fmt: skip
        title = "Bytes sent per step by the busiest rank of each axis, counted"
    else:
        handles = [Patch(color="#55A868", label="compute (replayed)"),
                   Patch(color="#C44E52", label="communication rounds (replayed)"),
                   Patch(color="#BBBBBB", label="waiting: bubbles, transfers (replayed)"),
                   Line2D([], [], marker="o", color="black", linestyle="",
                          label="utilization, wall clock"),
                   Line2D([], [], marker="_", markersize=14, color="black", linestyle="",
                          label="bubble bound M/(M+pp−1)")]  # fmt: skip
        title = "Where the step's rank-time goes, replayed as if every rank had its own device"
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3)
    fig.suptitle(title)
    save_figure(fig, path)


def _detail_section(ok: pd.DataFrame) -> str:
    rows = _ordered(ok)
    memory = pd.DataFrame({
        "N": rows["world_size"].astype(int), "layout": rows["layout"],
        **{label: rows[c].map(format_bytes) for c, label in PARTS.items()},
        "model states (max rank)": rows["model_state_bytes"].map(format_bytes),
        "model states (mean)": rows["model_state_bytes_mean"].map(format_bytes),
        "theory 16Ψ/k": rows["theory_model_state_bytes"].map(format_bytes),
        "mean ÷ theory": (rows["model_state_bytes_mean"] / rows["theory_model_state_bytes"]).map(format_ratio),
    })  # fmt: skip
    comm = pd.DataFrame({
        "N": rows["world_size"].astype(int), "layout": rows["layout"],
        **{f"{a} (counted)": rows[f"comm_bytes_{a}"].map(format_bytes) for a in AXIS_COLOURS},
        **{f"{a} (predicted)": rows[f"predicted_comm_bytes_{a}"].map(format_bytes) for a in AXIS_COLOURS},
        "rounds": rows["comm_rounds_per_step"].astype(int),
    })  # fmt: skip
    return (
        "## Memory per rank\n\n![memory per rank](memory_per_rank.png)\n\n"
        f"Theory ({MEMORY_SOURCE}): model states are 16 bytes per parameter (fp32 weight, "
        "gradient and AdamW's two moments), so DP holds 16Ψ on every rank and a layout "
        "that cuts one copy k = pp·tp ways holds 16Ψ/k per rank on average. TP keeps its "
        "LayerNorms and position embedding replicated, PP's end stages hold the embedding "
        "and LM head: mean ÷ theory shows what that costs. The parts are the fullest "
        "rank's.\n\n" + markdown_table(memory) + "\n\n"
        "## Communication per step\n\n![communication per step](comm_per_step.png)\n\n"
        "Counted bytes sent per step by the busiest rank on each axis, beside the papers' "
        "counts: DP one ring all-reduce of the rank's gradients, 2(d−1)/d·(Ψ_rank + 1)·4 "
        "bytes; TP Megatron's all-reduces of the (b, s, h) activations, two per block "
        "forward and two backward, plus the vocab-parallel embedding, LM head and "
        "cross-entropy (Shoeybi et al. 2019, §3), each 2(t−1)/t of its buffer; PP one "
        "activation forward and one gradient backward per micro-batch and stage boundary "
        "(GPipe). The counts add the step's barrier and loss broadcast, a few bytes.\n\n"
        + markdown_table(comm)
        + "\n\n"
    )


def _utilization_section(ok: pd.DataFrame) -> str:
    rows = _ordered(ok)
    waiting = rows["replayed_step_time_s"] - rows["replayed_compute_s"]
    waiting -= rows["replayed_comm_latency_s"] + rows["replayed_comm_bandwidth_s"]
    waiting = waiting.where(waiting > 1e-9 * rows["replayed_step_time_s"], 0.0)  # rounding
    table = pd.DataFrame({
        "N": rows["world_size"].astype(int), "layout": rows["layout"],
        "replayed step": rows["replayed_step_time_s"].map(format_seconds),
        "compute": rows["replayed_compute_s"].map(format_seconds),
        "comm: latency": rows["replayed_comm_latency_s"].map(format_seconds),
        "comm: bytes": rows["replayed_comm_bandwidth_s"].map(format_seconds),
        "waiting": waiting.map(format_seconds),
        "rounds": rows["comm_rounds_per_step"].astype(int),
        "α per round": rows["link_alpha_s"].map(format_seconds),
        "β per MiB": (rows["link_beta_s_per_byte"] * 2**20).map(format_seconds),
        "TP all-reduce's own work": [format_seconds(v) if t > 1 else "—"
                                     for v, t in zip(rows["tp_call_cpu_s"], rows["tp"], strict=True)],
    })  # fmt: skip
    text = (
        "## Utilization\n\n![utilization](utilization.png)\n\n"
        "Bars: the replayed step of each layout split into compute, communication rounds a "
        "rank must sit through (TP's all-reduces inside every layer, DP's all-reduce after "
        "the backward) and waiting (pipeline bubbles, transfer latency, a slower stage); "
        "the compute share is the replayed utilization. Bound: "
        f"{BUBBLE_SOURCE}, for the pipeline alone: communication lowers the replay below it, "
        "unequal stages too, while the step's work after the pipeline (the optimizer, which "
        "has no bubble) can lift it a little above. The table gives the replayed step per rank "
        "(means over ranks): compute; communication as latency — α per round, measured as "
        "the fastest exchange of 4 bytes between two otherwise idle ranks, plus each TP "
        "all-reduce's own work between its rounds (the clone its f/g make, the ring's "
        "slicing and additions, measured as thread CPU) — and as bytes at β, measured from "
        "a 1 MiB exchange; and the rest, waiting.\n\n" + markdown_table(table) + "\n"
    )
    tp = rows[(rows["strategy"] == "TP")]
    if not tp.empty:
        t = tp.iloc[-1]
        comm = t["replayed_comm_latency_s"] + t["replayed_comm_bandwidth_s"]
        text += (
            f"\nTP on {int(t['world_size'])} ranks spends {format_seconds(comm)} of its "
            f"{format_seconds(t['replayed_step_time_s'])} replayed step communicating, in "
            f"{int(t['comm_rounds_per_step'])} rounds per step, and "
            f"{_pct(t['replayed_comm_latency_s'] / comm)} of that is latency: here a round "
            f"costs {format_seconds(t['link_alpha_s'])} before a byte moves and an all-reduce "
            f"{format_seconds(t['tp_call_cpu_s'])} of its own work, against a few µs between "
            "GPUs on NVLink, while its bytes cost little. The rounds, not the volume, put TP's "
            'utilization where it is on this host; the lecture\'s "balanced" assumes a fast '
            "intra-node link (PTD-P keeps TP inside a server: Narayanan et al. 2021, §3.2, "
            "Takeaway #1).\n"
        )
    return text


def _correctness_section(ok: pd.DataFrame) -> tuple[str, int]:
    wrong = int(np.nansum(pd.to_numeric(ok["wrong"], errors="coerce")))
    rows = _ordered(ok)
    table = pd.DataFrame({
        "N": rows["world_size"].astype(int), "layout": rows["layout"],
        "loss": rows["loss"].map(lambda v: f"{v:.6g}"),
        "loss error (relative)": rows["loss_error"].map(lambda v: f"{v:.2g}"),
        "update error (relative)": rows["update_error"].map(lambda v: f"{v:.2g}"),
        "gradient error (relative)": rows["grad_error"].map(lambda v: f"{v:.2g}"),
        "max param diff": rows["max_param_diff"].map(lambda v: f"{v:.2g}"),
        "wrong": rows["wrong"].astype(int),
    })  # fmt: skip
    verdict = "every layout matched" if wrong == 0 else f"**{wrong} layout(s) wrong**"
    return (
        "## Correctness\n\nEach layout's losses, parameters and last gradients after its "
        "training steps against single-device AdamW on the whole batch, on the worst rank "
        "(update error ‖p − p_ref‖ / ‖p_ref − p_start‖; gradient error ‖g − g_ref‖ / "
        "‖g_ref‖, which catches a wrongly scaled gradient Adam's step would hide): "
        + verdict
        + ".\n\n"
        + markdown_table(table)
        + "\n"
    ), wrong


def _gap(value: float, digits: int = 2) -> str:
    return f"{round(value, digits) + 0.0:+.{digits}f}"  # + 0.0: no "-0.00"


def _headline(ok: pd.DataFrame) -> tuple[dict[str, Any], list[dict[str, str]]]:
    figures, values = [], {}
    for n in sorted(int(n) for n in ok["world_size"].unique()):
        pure = {name: _pure(ok, n, name) for name in ("DP", "TP", "PP")}
        dp, entry = pure["DP"], {}
        for name in ("TP", "PP"):
            row = pure[name]
            if row is None or dp is None:
                continue
            ratio = row["model_state_bytes_mean"] / dp["model_state_bytes_mean"]
            entry[f"{name.lower()}_model_states_vs_dp"] = ratio
            entry[f"{name.lower()}_memory_per_rank_vs_dp"] = (row["memory_per_rank_bytes"]
                                                              / dp["memory_per_rank_bytes"])  # fmt: skip
            figures.append(figure_row(
                f"{name} model states per rank (mean) ÷ DP's, N = {n}", f"1/{n} = {1 / n:.3f}",
                MEMORY_SOURCE, f"{ratio:.3f}", _gap(ratio - 1 / n, 3)))  # fmt: skip
        if pure["TP"] is not None and dp is not None:
            tp = pure["TP"]
            ratio = tp["comm_bytes_per_step"] / dp["comm_bytes_per_step"]
            theory = tp["predicted_comm_bytes_per_step"] / dp["predicted_comm_bytes_per_step"]
            entry["tp_comm_vs_dp"] = ratio
            figures.append(figure_row(
                f"TP communication per step ÷ DP's, N = {n}", f"{theory:.2f}× (lecture: higher)",
                COMM_SOURCE, format_ratio(ratio), f"{_gap(ratio - theory)}×"))  # fmt: skip
        for name, row in pure.items():
            if row is None:
                continue
            entry[f"{name.lower()}_util_replayed"] = row["util_replayed"]
            if name == "PP":
                entry["pp_util_bound"] = row["util_theory"]
                theory, source = _pct(row["util_theory"]), BUBBLE_SOURCE
                gap = f"{_gap(100 * (row['util_replayed'] - row['util_theory']), 1)} pts"
            else:
                theory, source, gap = f"{LECTURE[name][0]} (lecture)", LECTURE_SOURCE, "—"
            figures.append(figure_row(
                f"{name} utilization, replayed, N = {n}, M = {int(row['microbatches'])}",
                theory, source, _pct(row["util_replayed"]), gap))  # fmt: skip
        values[str(n)] = entry
    return values, figures


def write_report(df: pd.DataFrame, report_dir: Path) -> dict[str, Any]:
    """Write report.md, memory_per_rank.png, comm_per_step.png, utilization.png and
    headline.json."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    ok = ok_rows(df)
    failures = failures_list(df, ["world_size", "dp", "pp", "tp"])
    parts = ["# Parallelism comparison: DP, TP, PP and their 2D/3D compositions, measured\n"]
    values: dict[str, Any] = {}
    figures: list[dict[str, str]] = []
    verdicts: list[str] = []
    wrong = 0
    if ok.empty:
        parts.append("No cell finished; nothing was measured.\n")
    else:
        for kind, name in (("memory", "memory_per_rank"), ("comm", "comm_per_step"),
                           ("utilization", "utilization")):  # fmt: skip
            _plot(ok, report_dir / f"{name}.png", kind)
        table, verdicts = _table_section(ok)
        correctness, wrong = _correctness_section(ok)
        parts += [_setup_section(df, ok), table, _detail_section(ok), _utilization_section(ok)]
        parts.append(correctness)
        values, figures = _headline(ok)
    figures.append(
        figure_row("wrong layouts", "0", "single-device reference", str(wrong), f"{wrong:+d}")
    )
    figures.append(
        figure_row("failed cells", "0", "grid", str(len(failures)), f"{len(failures):+d}")
    )
    parts.append(failed_cells_markdown(failures))
    write_text_atomic(report_dir / "report.md", "\n".join(parts))
    headline = {
        "experiment": "parallelism_comparison",
        "by_world_size": values,
        "lecture_checks": verdicts,
        "wrong_total": wrong,
        "failed_cells": len(failures),
        "failures": failures,
        "figures": figures,
    }
    write_headline(report_dir, headline)
    return to_jsonable(headline)
