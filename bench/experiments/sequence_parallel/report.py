"""The `sequence_parallel` report: Megatron-SP, Ulysses and Ring Attention, communication per
link and activation memory per rank measured beside the papers' formulas (the formulas
as the experiment's `predicted_*` columns carry them: the comment above `communication`).

Activation memory stands beside two predictions: Korthikanti et al.'s Table 2 formula and
the experiment's model of what this implementation saves (the one the measured rows check,
and the one the longest sequence within the memory budget comes from: a model output,
indexed as such). The skeleton (`bench.report.skeleton`) writes the setup, correctness
totals and failed cells.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import pandas as pd

from bench.experiments.sequence_parallel.plots import methods, name, plot_by_degree, plot_ratio
from bench.report import (
    Context,
    Report,
    format_bytes,
    format_ratio,
    format_seconds,
    is_missing,
    markdown_table,
    prose,
)

__all__ = ["REPORT"]

_prose = partial(prose, __package__)  # this experiment's prose.md.j2 macros

COMM_SOURCE = (
    "Korthikanti et al. 2022 §4.2.2; Jacobs et al. 2023 §3.2; Liu et al. 2023 §3 "
    "(`analytic.layer_traffic`)"
)
RATIO_SOURCE = "Jacobs et al. 2023 (arXiv 2309.14509) §3.2: per-link volume 1/P of Megatron-SP's"
PAPER_MEMORY = "Korthikanti et al. 2022 (arXiv 2205.05198) Table 2"
MODEL_MEMORY = "this code's saved tensors, Korthikanti et al. §4.1's accounting"


def _pct(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{100 * value:+.2f}%"


def _int(value: Any) -> int | None:
    return None if is_missing(value) else int(value)


def _text(value: Any) -> str:
    return "—" if is_missing(value) else f"{int(value):,}"


def _set(values: pd.Series) -> str:
    return "{" + ", ".join(str(int(v)) for v in sorted(values.unique())) + "}"


def _sorted(ok: pd.DataFrame) -> pd.DataFrame:
    order = {m: i for i, m in enumerate(methods(ok))}
    return ok.sort_values(["sp", "seq_len"]).sort_values(
        "method", key=lambda c: c.map(order), kind="stable"
    )


def measured_what(ctx: Context) -> str | None:
    """What was measured, on what

    **Per link** (Jacobs et al. §3.2): the bytes one rank puts on its link in one layer's
    forward plus backward — it receives as many — counted exactly by distbench's
    communicator, the busiest rank's; the gradient all-reduce of replicated weights is a
    per-step cost, listed apart. **Activation bytes per rank**: what autograd saves for
    backward in the layer's forward (`saved_tensors_hooks` through a memory ledger, each
    storage once, weights excluded). **Peak**: the most the ledger held during forward +
    backward — the rank's weights, saved activations and gradients (on CPU there is no
    allocator to ask; communication buffers are not in it)."""
    ok = ctx.ok
    if ok.empty:
        return None
    first = ok.iloc[0]
    return _prose(
        "measured",
        methods=", ".join(map(name, methods(ok))),
        sps=_set(ok["sp"]),
        lens=_set(ok["seq_len"]),
        batch=_text(first["batch_size"]),
        width=_text(first["d_model"]),
        heads=_text(first["n_heads"]),
        ff=_text(first["d_ff"]),
    )


def _off(cells: str) -> str:
    return f"off: {cells}" if cells else ""


def _comm_table(rows: pd.DataFrame) -> str:
    pairs = zip(rows["comm_bytes_fwd"], rows["comm_bytes_bwd"], strict=True)
    rounds = zip(rows["comm_rounds"], rows["predicted_comm_rounds"], strict=True)
    return markdown_table(
        pd.DataFrame(
            {
                "method": rows["method"].map(name),
                "P": rows["sp"],
                "s": rows["seq_len"],
                "per link (counted)": rows["comm_bytes_per_link_per_layer"].map(format_bytes),
                "formula": rows["predicted_comm_bytes_per_link_per_layer"].map(format_bytes),
                "fwd / bwd (counted)": [f"{format_bytes(f)} / {format_bytes(b)}" for f, b in pairs],
                "rounds (counted / formula)": [f"{_text(r)} / {_text(p)}" for r, p in rounds],
                "grad all-reduce per step": rows["grad_sync_bytes_per_step"].map(format_bytes),
            }
        ),
        numparse=False,
    )


# The formulas, as the experiment's `predicted_*` columns carry them (with the exact
# (P − 1)/P factors of ring and all-to-all collectives; b batch, L = ceil(s/P), h width, e
# bytes per element), per layer, forward + backward, bytes one rank sends:
#
# - Megatron-SP (Korthikanti et al. 2022, arXiv 2205.05198, §4.2.2): 4 all-gathers / reduce-
#   scatters each way, 8·(P − 1)·b·L·h·e ≈ 8·b·s·h·e — constant in P;
# - Ulysses (Jacobs et al. 2023, arXiv 2309.14509, §3.2): 4 all-to-alls each way,
#   8·(P − 1)/P·b·L·h·e ≈ 8·b·s·h·e/P — so Ulysses ÷ Megatron-SP = 1/P exactly;
# - Ring Attention (Liu et al. 2023, arXiv 2310.01889, §3): P − 1 K/V blocks forward, P − 1
#   K/V and P dK/dV blocks backward, (3P − 2)·2·b·L·h·e ≈ 6·b·s·h·e.
def communication(ctx: Context) -> str | None:
    """Communication per link

    Formulas (Korthikanti et al. 2022 §4.2.2; Jacobs et al. 2023 §3.2; Liu et al. 2023 §3),
    per layer, forward + backward, b batch, L = ceil(s/P) positions per rank, h width, e = 4
    bytes: Megatron-SP 8·(P − 1)·b·L·h·e (≈ 8·b·s·h·e, constant in P), Ulysses
    8·(P − 1)/P·b·L·h·e (≈ 8·b·s·h·e/P), Ring Attention (3P − 2)·2·b·L·h·e (≈ 6·b·s·h·e).
    Lines are the formulas, points the counters. The last column is not in the per-link
    figure: Ulysses and Ring Attention replicate every weight, so each step also
    all-reduces the whole block's gradients, as data parallelism would; Megatron-SP only
    its LayerNorms' and biases'."""
    if ctx.ok.empty:
        return None
    rows = _sorted(ctx.ok[ctx.ok["sp"] > 1])
    if rows.empty:
        ctx.headline["comm_rows_equal_formula"] = {"rows": 0}
        return _prose("no_parallel_cell")
    counted = rows["comm_bytes_per_link_per_layer"]
    exact = (counted == rows["predicted_comm_bytes_per_link_per_layer"]) & (counted > 0)
    deviation = float((rows["comm_vs_predicted"] - 1).abs().max())
    matched = int(exact.sum())
    ctx.headline["comm_rows_equal_formula"] = {
        "rows": len(rows),
        "exact_rows": matched,
        "max_deviation": deviation,
    }
    ctx.figure(
        "rows (P > 1) whose counted bytes per link equal the formula",
        theory="all",
        source=COMM_SOURCE,
        measured=f"{matched} of {len(rows)}",
        gap=f"{matched - len(rows):+d}",
    )
    off = ", ".join(ctx.key(r) for _, r in rows[~exact].iterrows())
    ctx.finding(_prose("comm_finding"), bool(exact.all()), _off(off))
    plot = plot_by_degree(
        ctx,
        rows,
        "comm_per_link",
        {"predicted_comm_bytes_per_link_per_layer": "formula"},
        "comm_bytes_per_link_per_layer",
        "bytes per link per layer",
    )
    summary = _prose("comm_summary", exact=matched, rows=len(rows), deviation=f"{deviation:.3g}")
    return f"{plot}\n\n{summary}\n\n{_comm_table(rows)}"


def _ratios(ok: pd.DataFrame, method: str) -> pd.DataFrame:
    """`method` ÷ Megatron-SP per-link volume, counted and by formula, per (P, s)."""
    key = ["sp", "seq_len"]
    cols = [*key, "comm_bytes_per_link_per_layer", "predicted_comm_bytes_per_link_per_layer"]
    base = ok[(ok["method"] == "megatron_sp") & (ok["sp"] > 1)][cols]
    other = ok[ok["method"] == method][cols]
    merged = other.merge(base, on=key, suffixes=("", "_megatron")).sort_values(key)
    return merged.assign(
        measured=merged["comm_bytes_per_link_per_layer"]
        / merged["comm_bytes_per_link_per_layer_megatron"],
        formula=merged["predicted_comm_bytes_per_link_per_layer"]
        / merged["predicted_comm_bytes_per_link_per_layer_megatron"],
    )


def _ratio_table(ulysses: pd.DataFrame, ring: pd.DataFrame) -> str:
    rows = []
    for (sp, seq_len), group in ulysses.groupby(["sp", "seq_len"]):
        other = ring[(ring["sp"] == sp) & (ring["seq_len"] == seq_len)]
        rows.append(
            {
                "P": int(sp),
                "s": int(seq_len),
                "Ulysses ÷ Megatron-SP (counted)": f"{group['measured'].iloc[0]:.4f}",
                "formula 1/P": f"{1 / sp:.4f}",
                "Ring ÷ Megatron-SP (counted)": f"{other['measured'].iloc[0]:.4f}"
                if len(other)
                else "—",
                "formula (3P−2)/(4(P−1))": f"{(3 * sp - 2) / (4 * (sp - 1)):.4f}",
            }
        )
    return markdown_table(pd.DataFrame(rows), numparse=False)


def ulysses_ratio(ctx: Context) -> str | None:
    """Ulysses ÷ Megatron-SP per link, as P grows

    Theory (Jacobs et al. 2023, arXiv 2309.14509, §3.2): an all-to-all sends (P − 1)/P of a
    rank's b·L·h chunk, a ring all-gather or reduce-scatter (P − 1) chunks, both four times
    each way — the ratio is 1/P, exactly, padding included. Ring Attention ÷ Megatron-SP
    tends to 3/4 (Liu et al. §3: K and V around the ring forward, K/V and dK/dV
    backward)."""
    if ctx.ok.empty:
        return None
    ulysses = _ratios(ctx.ok, "ulysses")
    if ulysses.empty:
        ctx.headline["ulysses_vs_megatron_per_link"] = None
        return _prose("no_ratio")
    largest = ulysses[ulysses["sp"] == ulysses["sp"].max()]
    sp = int(largest["sp"].iloc[0])
    entry = {
        "sp": sp,
        "measured": float(largest["measured"].max()),
        "measured_min": float(largest["measured"].min()),
        "formula": 1 / sp,
    }
    measured, formula = f"{entry['measured']:.4f}", f"{entry['formula']:.4f}"
    ctx.headline["ulysses_vs_megatron_per_link"] = entry
    ctx.figure(
        f"Ulysses ÷ Megatron-SP bytes per link per layer, P = {sp}",
        theory=f"1/P = {formula}",
        source=RATIO_SOURCE,
        measured=measured,
        gap=f"{entry['measured'] - entry['formula']:+.4f}",
    )
    off = ulysses[~((ulysses["measured"] * ulysses["sp"] - 1).abs() < 1e-12)]
    cells = ", ".join(f"P={int(r.sp)}, s={int(r.seq_len)}" for r in off.itertuples())
    ctx.finding(_prose("ratio_finding"), off.empty, _off(cells))
    summary = _prose("ratio_summary", sp=sp, measured=measured, formula=formula)
    table = _ratio_table(ulysses, _ratios(ctx.ok, "ring_attention"))
    return f"{plot_ratio(ctx, ulysses)}\n\n{summary}\n\n{table}"


def _memory_table(rows: pd.DataFrame, error: pd.Series) -> str:
    return markdown_table(
        pd.DataFrame(
            {
                "method": rows["method"].map(name),
                "P": rows["sp"],
                "s": rows["seq_len"],
                "saved (measured)": rows["activation_bytes_per_rank"].map(format_bytes),
                "implementation model": rows["model_activation_bytes_per_rank"].map(format_bytes),
                "error": error.map(_pct),
                "paper formula": rows["predicted_activation_bytes_per_rank"].map(format_bytes),
                "measured ÷ paper": rows["activation_vs_predicted"].map(format_ratio),
                "weights": rows["param_bytes"].map(format_bytes),
                "peak": rows["peak_bytes"].map(format_bytes),
            }
        ),
        numparse=False,
    )


def activation_memory(ctx: Context) -> str | None:
    """Activation memory per rank

    Two predictions stand beside the measurement. The paper formula (Korthikanti et al.
    2022, arXiv 2205.05198, Table 2; `analytic.activation_bytes_per_rank`):
    s·b·h·(34/P + 5·a·s/(h·P)) bytes for Megatron-SP and Ulysses, s·b·h·34/P + 5·a·b·(s/P)²
    for Ring Attention — 16-bit activations, 1-byte dropout masks and the a·s² attention
    scores held for backward. The implementation model
    (`theory.implementation_activation_bytes`, Korthikanti et al. §4.1's accounting
    applied to this code) counts what this code keeps: float32, no dropout, torch's fused
    attention (a log-sum-exp per query, never the s × s scores), and Megatron-SP's
    all-gathered QKV and fc1 inputs kept whole (the paper re-gathers them in backward,
    §4.2.3, so its 34/P shrinks where this code's 2·b·s·h·e does not). fp32 doubles the
    paper's per-position terms, and the scores it charges grow as s² while fused attention
    stores none."""
    if ctx.ok.empty:
        return None
    rows = _sorted(ctx.ok)
    measured = rows["activation_bytes_per_rank"]
    error = rows["activation_vs_model"] - 1
    by_method = error.abs().groupby(rows["method"]).max()
    paper = rows["activation_vs_predicted"]
    worst = float(by_method.max())
    low, high = format_ratio(paper.min()), format_ratio(paper.max())
    ctx.headline["activation_model_error"] = {
        "max_error": worst,
        "by_method": by_method.to_dict(),
        "vs_paper_min": float(paper.min()),
        "vs_paper_max": float(paper.max()),
    }
    ctx.figure(
        "activation bytes per rank vs the implementation model, worst row",
        theory="0%",
        source=MODEL_MEMORY,
        measured=_pct(worst),
        gap=_pct(worst),
    )
    ctx.figure(
        "activation bytes per rank, measured ÷ paper formula (range over rows)",
        theory="1×",
        source=PAPER_MEMORY,
        measured=f"{low} … {high}",
        gap="fp32, fused attention: see report",
    )
    exact = (measured == rows["model_activation_bytes_per_rank"]) & (measured > 0)
    ctx.finding(_prose("memory_finding"), bool(exact.all()), f"worst row {_pct(worst)}")
    plot = plot_by_degree(
        ctx,
        rows,
        "activation_per_rank",
        {
            "model_activation_bytes_per_rank": "implementation model",
            "predicted_activation_bytes_per_rank": "paper formula",
        },
        "activation_bytes_per_rank",
        "activation bytes per rank per layer",
    )
    summary = _prose(
        "memory_summary",
        worst=_pct(worst),
        per_method=", ".join(f"{name(m)} {_pct(e)}" for m, e in by_method.items()),
        low=low,
        high=high,
    )
    return f"{summary}\n\n{plot}\n\n{_memory_table(rows, error)}"


def _longest(rows: pd.DataFrame) -> dict[str, dict[int, dict[str, int | None]]]:
    longest: dict[str, dict[int, dict[str, int | None]]] = {}
    for row in rows.itertuples():
        longest.setdefault(row.method, {})[int(row.sp)] = {
            "model": _int(row.max_seq_len_in_budget),
            "paper": _int(row.paper_max_seq_len_in_budget),
        }
    return longest


def longest_sequence(ctx: Context) -> str | None:
    """Longest sequence within the memory budget

    The largest s whose activations for the model's depth of such blocks fit the budget per
    rank (weights, gradients and optimizer state not included), from the implementation
    model — the model the measured rows above check — and, for comparison, from the paper
    formula (Korthikanti et al. 2022, Table 2). These are the model's extrapolation, not
    runs at those lengths, and they count what is saved for backward only: transient
    working memory — collective buffers, and Ring Attention's score block of b·a·(s/P)²
    floats per ring step, which this implementation computes with plain matmuls rather
    than a fused kernel — comes on top."""
    if ctx.ok.empty:
        return None
    columns = ["method", "sp", "max_seq_len_in_budget", "paper_max_seq_len_in_budget"]
    rows = _sorted(ctx.ok).drop_duplicates(["method", "sp"])[columns]
    first = ctx.ok.iloc[0]
    budget, layers = first["memory_budget_bytes"], _int(first["budget_layers"])
    longest = _longest(rows)
    ctx.headline["longest_seq_len_in_budget"] = {
        "memory_budget_bytes": budget,
        "layers": layers,
        "longest": longest,
    }
    for method, by_sp in longest.items():
        sp = max(by_sp)
        model, paper = by_sp[sp]["model"], by_sp[sp]["paper"]
        ctx.figure(
            _prose(
                "longest_figure",
                method=name(method),
                budget=format_bytes(budget),
                layers=layers,
                sp=sp,
            ),
            theory=f"{_text(paper)} (paper formula)",
            source=f"{PAPER_MEMORY} formula",
            model=_text(model),
            gap=format_ratio(model / paper) if model and paper else "—",
        )
    error = (ctx.headline.get("activation_model_error") or {}).get("max_error")
    table = pd.DataFrame(
        {
            "method": rows["method"].map(name),
            "P": rows["sp"],
            "longest s (implementation model, validated)": rows["max_seq_len_in_budget"].map(_text),
            "longest s (paper formula)": rows["paper_max_seq_len_in_budget"].map(_text),
        }
    )
    summary = _prose(
        "longest_summary", budget=format_bytes(budget), layers=_text(layers), error=_pct(error)
    )
    return f"{summary}\n\n{markdown_table(table, numparse=False)}"


def step_time(ctx: Context) -> str | None:
    """Step time

    One layer's forward + backward, barrier-opened, the slowest rank's time, median of the
    repeats. The communication and memory figures above do not depend on the machine.
    Megatron-SP and Ulysses attend with torch's fused attention kernel; Ring Attention's
    blocks are plain matmuls with an online softmax, so on one host it pays for the (s/P)²
    score blocks that the fused kernel tiles away."""
    if ctx.ok.empty:
        return None
    rows = _sorted(ctx.ok)
    table = pd.DataFrame(
        {
            "method": rows["method"].map(name),
            "P": rows["sp"],
            "s": rows["seq_len"],
            "step time (fwd + bwd, slowest rank, median)": rows["step_time_s"].map(format_seconds),
        }
    )
    cores = int(ctx.cores) if math.isfinite(ctx.cores) else None
    wall_clock = _prose("wall_clock", cores=cores)
    return f"{wall_clock}\n\n{markdown_table(table, numparse=False)}"


def errors(ctx: Context) -> str | None:
    """Errors against the single-device block

    Error = max|got − want| / max|want| per tensor (a weight gradient's scale is at least
    1/1000 of the block's largest: k_proj's bias has a zero gradient); each cell's largest,
    and how many of its tensors were wrong."""
    if ctx.ok.empty:
        return None
    rows = _sorted(ctx.ok)
    wrong = pd.to_numeric(rows["wrong"], errors="coerce")
    total = int(wrong.sum()) if wrong.notna().all() else None
    table = pd.DataFrame(
        {
            "method": rows["method"].map(name),
            "P": rows["sp"],
            "s": rows["seq_len"],
            "padded positions": rows["padded_positions"].map(_text),
            "max normalised error": rows["max_error"].map(lambda v: f"{v:.2g}"),
            "wrong": wrong.map(_text),
        }
    )
    verdict = _prose(
        "errors", tolerance=f"{rows['tolerance'].max():g}", matched=total == 0, wrong=_text(total)
    )
    return f"{verdict}\n\n{markdown_table(table, numparse=False)}"


REPORT = Report(
    title="Sequence parallelism: communication per link and activation memory per rank",
    intro=_prose("intro"),
    sections=(
        measured_what,
        communication,
        ulysses_ratio,
        activation_memory,
        longest_sequence,
        step_time,
        errors,
    ),
    correctness=_prose("correctness"),
)
