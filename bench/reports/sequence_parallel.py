"""Report for `sequence_parallel`: Megatron-SP, Ulysses and Ring Attention, communication
per link and activation memory per rank measured beside the papers' formulas.

The formulas, as the experiment's `predicted_*` columns carry them (with the exact
(P − 1)/P factors of ring and all-to-all collectives; b batch, L = ceil(s/P), h width, e
bytes per element), per layer, forward + backward, bytes one rank sends:

- Megatron-SP (Korthikanti et al. 2022, arXiv 2205.05198, §4.2.2): 4 all-gathers / reduce-
  scatters each way, 8·(P − 1)·b·L·h·e ≈ 8·b·s·h·e — constant in P;
- Ulysses (Jacobs et al. 2023, arXiv 2309.14509, §3.2): 4 all-to-alls each way,
  8·(P − 1)/P·b·L·h·e ≈ 8·b·s·h·e/P — so Ulysses ÷ Megatron-SP = 1/P exactly;
- Ring Attention (Liu et al. 2023, arXiv 2310.01889, §3): P − 1 K/V blocks forward, P − 1
  K/V and P dK/dV blocks backward, (3P − 2)·2·b·L·h·e ≈ 6·b·s·h·e.

Activation memory stands beside two predictions: Korthikanti et al.'s Table 2 formula and
the experiment's model of what this implementation saves (the one the measured rows check,
and the one the longest sequence within the memory budget comes from). Every number here
is read from the results; theory is labelled with its source.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter

from bench.reports import (
    failed_cells_markdown,
    failures_list,
    figure_row,
    format_bytes,
    format_ratio,
    format_seconds,
    log2_axis,
    markdown_table,
    new_figure,
    ok_rows,
    run_context,
    save_figure,
    to_jsonable,
    write_headline,
    write_text_atomic,
)

__all__ = ["METHODS", "write_report"]

METHODS = {"megatron_sp": "Megatron-SP", "ulysses": "Ulysses", "ring_attention": "Ring Attention"}
COLOURS = {"megatron_sp": "#4C72B0", "ulysses": "#DD8452", "ring_attention": "#55A868"}
# Marker and size per method: where two methods' values coincide (Megatron-SP and Ulysses
# at P = 1; Megatron-SP and Ring Attention per link at P = 2) the smaller one stays visible.
MARKERS = {"megatron_sp": ("o", 70), "ulysses": ("s", 40), "ring_attention": ("D", 18)}
COMM_SOURCE = ("Korthikanti et al. 2022 §4.2.2; Jacobs et al. 2023 §3.2; Liu et al. 2023 §3 "
               "(`analytic.layer_traffic`)")  # fmt: skip
RATIO_SOURCE = "Jacobs et al. 2023 (arXiv 2309.14509) §3.2: per-link volume 1/P of Megatron-SP's"
PAPER_MEMORY = "Korthikanti et al. 2022 (arXiv 2205.05198) Table 2"
MODEL_MEMORY = "this code's saved tensors, Korthikanti et al. §4.1's accounting"


def _name(method: str) -> str:
    return METHODS.get(method, method)


def _methods(df: pd.DataFrame) -> list[str]:
    present = {str(m) for m in pd.unique(df["method"])}
    return [m for m in METHODS if m in present] + sorted(present - set(METHODS))


def _pct(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{100 * value:+.2f}%"


def _sorted(ok: pd.DataFrame) -> pd.DataFrame:
    order = {m: i for i, m in enumerate(_methods(ok))}
    return ok.sort_values(["sp", "seq_len"]).sort_values(
        "method", key=lambda c: c.map(order), kind="stable"
    )


def _setup_section(df: pd.DataFrame, ok: pd.DataFrame) -> str:
    first = ok.iloc[0]
    sps = ", ".join(str(int(p)) for p in sorted(ok["sp"].unique()))
    lens = ", ".join(str(int(s)) for s in sorted(ok["seq_len"].unique()))
    methods = ", ".join(_name(m) for m in _methods(ok))
    return (
        "## What was measured, on what\n\n"
        f"{methods} on P ∈ {{{sps}}} ranks, s ∈ {{{lens}}} (lengths P does not divide are "
        "end-padded to ceil(s/P) positions per rank; all three methods accept them). One "
        f"transformer block, b = {int(first['batch_size'])}, h = {int(first['d_model'])}, "
        f"a = {int(first['n_heads'])} heads, MLP width {int(first['d_ff'])}, float32: "
        "Megatron-SP's block is tensor-parallel inside; Ulysses and Ring Attention run "
        "replicated LayerNorms and MLP on each rank's positions around their attention. "
        f"{run_context(df if 'world_size' in df else df.assign(world_size=df['sp']))}"
        "\n\n**Per link** (Jacobs et al. §3.2): the bytes one rank puts on its link in one "
        "layer's forward plus backward — it receives as many — counted exactly by "
        "distbench's communicator, the busiest rank's; the gradient all-reduce of "
        "replicated weights is a per-step cost, listed apart. **Activation bytes per rank**: "
        "what autograd saves for backward in the layer's forward (`saved_tensors_hooks` "
        "through `MemoryLedger`, each storage once, weights excluded). **Peak**: the most "
        "the ledger held during forward + backward — the rank's weights, saved "
        "activations and gradients (on CPU there is no allocator to ask; communication "
        "buffers are not in it).\n"
    )


def _bytes_axis(ax: Any) -> None:
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))


def _plot_by_degree(ok: pd.DataFrame, path: Path, lines: dict[str, str], measured: str,
                    title: str) -> None:  # fmt: skip
    """One panel per P: each method's formula(s) as lines, its measurements as markers."""
    degrees = sorted(int(p) for p in ok["sp"].unique())
    fig, axes = new_figure(4.2 * len(degrees) + 1, 4.2, 1, len(degrees), sharey=True)
    lens = sorted(int(s) for s in ok["seq_len"].unique())
    for ax, sp in zip(axes, degrees, strict=True):
        panel = ok[ok["sp"] == sp].sort_values("seq_len")
        for method in _methods(panel):
            rows, colour = panel[panel["method"] == method], COLOURS.get(method)
            for (column, label), style in zip(lines.items(), ("-", "--"), strict=False):
                ax.plot(rows["seq_len"], rows[column], linestyle=style, color=colour,
                        alpha=0.8, label=f"{_name(method)}, {label}")  # fmt: skip
            marker, size = MARKERS.get(method, ("^", 30))
            ax.scatter(rows["seq_len"], rows[measured], color=colour, zorder=5, s=size,
                       marker=marker, label=f"{_name(method)}, measured")  # fmt: skip
        log2_axis(ax, lens)
        _bytes_axis(ax)
        ax.set(title=f"P = {sp}", xlabel="sequence length s")
    axes[0].set_ylabel(title)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3,
               fontsize="small")  # fmt: skip
    save_figure(fig, path)


def _comm_section(ok: pd.DataFrame, report_dir: Path) -> tuple[str, dict[str, Any]]:
    rows = _sorted(ok[ok["sp"] > 1])
    if rows.empty:
        return "## Communication per link\n\nNo cell has P > 1.\n", {"rows": 0}
    _plot_by_degree(rows, report_dir / "comm_per_link.png",
                    {"predicted_comm_bytes_per_link_per_layer": "formula"},
                    "comm_bytes_per_link_per_layer", "bytes per link per layer")  # fmt: skip
    exact = rows["comm_bytes_per_link_per_layer"] == rows["predicted_comm_bytes_per_link_per_layer"]
    deviation = float((rows["comm_vs_predicted"] - 1).abs().max())
    table = pd.DataFrame({
        "method": rows["method"].map(_name), "P": rows["sp"], "s": rows["seq_len"],
        "per link (counted)": rows["comm_bytes_per_link_per_layer"].map(format_bytes),
        "formula": rows["predicted_comm_bytes_per_link_per_layer"].map(format_bytes),
        "fwd / bwd (counted)": [f"{format_bytes(f)} / {format_bytes(b)}" for f, b in
                                zip(rows["comm_bytes_fwd"], rows["comm_bytes_bwd"], strict=True)],
        "rounds (counted / formula)": [f"{int(r)} / {int(p)}" for r, p in
                                       zip(rows["comm_rounds"], rows["predicted_comm_rounds"],
                                           strict=True)],
        "grad all-reduce per step": rows["grad_sync_bytes_per_step"].map(format_bytes),
    })  # fmt: skip
    text = (
        "## Communication per link\n\n"
        f"Formulas ({COMM_SOURCE}), per layer, forward + backward, b batch, L = ceil(s/P) "
        "positions per rank, h width, e = 4 bytes: Megatron-SP 8·(P − 1)·b·L·h·e (≈ 8·b·s·h·e, "
        "constant in P), Ulysses 8·(P − 1)/P·b·L·h·e (≈ 8·b·s·h·e/P), Ring Attention "
        "(3P − 2)·2·b·L·h·e (≈ 6·b·s·h·e). Lines are the formulas, points the counters.\n\n"
        "![communication per link](comm_per_link.png)\n\n"
        f"**{int(exact.sum())} of {len(rows)}** rows with P > 1 equal their formula to the "
        f"byte (largest |counted / formula − 1| = {deviation:.3g}). The last column is not "
        "in the per-link figure: Ulysses and Ring Attention replicate every weight, so "
        "each step also all-reduces the whole block's gradients, as data parallelism "
        "would; Megatron-SP only its LayerNorms' and biases'.\n\n"
        f"{markdown_table(table)}\n"
    )
    return text, {"rows": len(rows), "exact_rows": int(exact.sum()), "max_deviation": deviation}


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


def _plot_ratio(ulysses: pd.DataFrame, path: Path) -> None:
    fig, (ax,) = new_figure(6.0, 4.2)
    degrees = sorted(int(p) for p in ulysses["sp"].unique())
    grid = np.linspace(min(degrees), max(degrees), 100)
    ax.plot(grid, 1 / grid, color="grey", label="formula 1/P (Jacobs et al. 2023 §3.2)")
    for i, (seq_len, rows) in enumerate(ulysses.groupby("seq_len")):
        # Every s gives the same ratio: hollow markers shrinking with s keep each visible.
        ax.scatter(rows["sp"], rows["measured"], marker="osD^v<>"[i % 7], s=90 - 12 * (i % 6),
                   facecolors="none", edgecolors=f"C{i % 10}", linewidths=1.5, zorder=5,
                   label=f"counted, s = {int(seq_len)}")  # fmt: skip
    log2_axis(ax, degrees)
    ax.set(xlabel="sequence-parallel degree P", ylabel="Ulysses ÷ Megatron-SP bytes per link",
           title="Per-link volume, Ulysses relative to Megatron-SP")  # fmt: skip
    ax.legend(fontsize="small")
    save_figure(fig, path)


def _ratio_section(ok: pd.DataFrame, report_dir: Path) -> tuple[str, dict[str, Any] | None]:
    ulysses = _ratios(ok, "ulysses")
    if ulysses.empty:
        return "## Ulysses ÷ Megatron-SP\n\nThe run has no pair of P > 1 cells to divide.\n", None
    _plot_ratio(ulysses, report_dir / "ulysses_vs_megatron.png")
    ring = _ratios(ok, "ring_attention")
    rows = []
    for (sp, seq_len), group in ulysses.groupby(["sp", "seq_len"]):
        other = ring[(ring["sp"] == sp) & (ring["seq_len"] == seq_len)]
        rows.append({"P": int(sp), "s": int(seq_len),
                     "Ulysses ÷ Megatron-SP (counted)": f"{group['measured'].iloc[0]:.4f}",
                     "formula 1/P": f"{1 / sp:.4f}",
                     "Ring ÷ Megatron-SP (counted)": f"{other['measured'].iloc[0]:.4f}"
                     if len(other) else "—",
                     "formula (3P−2)/(4(P−1))": f"{(3 * sp - 2) / (4 * (sp - 1)):.4f}"})  # fmt: skip
    largest = ulysses[ulysses["sp"] == ulysses["sp"].max()]
    entry = {"sp": int(largest["sp"].iloc[0]), "measured": float(largest["measured"].max()),
             "measured_min": float(largest["measured"].min()),
             "formula": 1 / float(largest["sp"].iloc[0])}  # fmt: skip
    text = (
        "## Ulysses ÷ Megatron-SP per link, as P grows\n\n"
        f"Theory ({RATIO_SOURCE}): an all-to-all sends (P − 1)/P of a rank's b·L·h chunk, a "
        "ring all-gather or reduce-scatter (P − 1) chunks, both four times each way — the "
        "ratio is 1/P, exactly, padding included. Ring Attention ÷ Megatron-SP tends to "
        "3/4 (Liu et al. §3: K and V around the ring forward, K/V and dK/dV backward).\n\n"
        "![Ulysses / Megatron-SP](ulysses_vs_megatron.png)\n\n"
        f"At the largest P = {entry['sp']}: counted {entry['measured']:.4f} (formula "
        f"{entry['formula']:.4f}).\n\n{markdown_table(pd.DataFrame(rows))}\n"
    )
    return text, entry


def _memory_section(ok: pd.DataFrame, report_dir: Path) -> tuple[str, dict[str, Any]]:
    rows = _sorted(ok)
    _plot_by_degree(rows, report_dir / "activation_per_rank.png",
                    {"model_activation_bytes_per_rank": "implementation model",
                     "predicted_activation_bytes_per_rank": "paper formula"},
                    "activation_bytes_per_rank", "activation bytes per rank per layer")  # fmt: skip
    error = rows["activation_vs_model"] - 1
    by_method = error.abs().groupby(rows["method"]).max()
    paper = rows["activation_vs_predicted"]
    table = pd.DataFrame({
        "method": rows["method"].map(_name), "P": rows["sp"], "s": rows["seq_len"],
        "saved (measured)": rows["activation_bytes_per_rank"].map(format_bytes),
        "implementation model": rows["model_activation_bytes_per_rank"].map(format_bytes),
        "error": error.map(_pct),
        "paper formula": rows["predicted_activation_bytes_per_rank"].map(format_bytes),
        "measured ÷ paper": paper.map(format_ratio),
        "weights": rows["param_bytes"].map(format_bytes),
        "peak": rows["peak_bytes"].map(format_bytes),
    })  # fmt: skip
    worst = float(by_method.max())
    text = (
        "## Activation memory per rank\n\n"
        f"Two predictions stand beside the measurement. The paper formula ({PAPER_MEMORY}, "
        "`analytic.activation_bytes_per_rank`): s·b·h·(34/P + 5·a·s/(h·P)) bytes for "
        "Megatron-SP and Ulysses, s·b·h·34/P + 5·a·b·(s/P)² for Ring Attention — 16-bit "
        "activations, 1-byte dropout masks and the a·s² attention scores held for "
        "backward. The implementation model (`implementation_activation_bytes`, "
        f"{MODEL_MEMORY}) counts what this code keeps: float32, no dropout, torch's fused "
        "attention (a log-sum-exp per query, never the s × s scores), and Megatron-SP's "
        "all-gathered QKV and fc1 inputs kept whole (the paper re-gathers them in "
        "backward, §4.2.3, so its 34/P shrinks where this code's 2·b·s·h·e does not).\n\n"
        f"The implementation model matches every measured row to within **{_pct(worst)}** "
        f"(per method: {', '.join(f'{_name(m)} {_pct(e)}' for m, e in by_method.items())}); "
        f"measured ÷ paper formula ranges {format_ratio(paper.min())} … "
        f"{format_ratio(paper.max())}: fp32 doubles the per-position terms, and the scores "
        "the formula charges grow as s² while fused attention stores none.\n\n"
        "![activation memory per rank](activation_per_rank.png)\n\n"
        f"{markdown_table(table)}\n"
    )
    return text, {"max_error": worst, "by_method": by_method.to_dict(),
                  "vs_paper_min": float(paper.min()), "vs_paper_max": float(paper.max())}  # fmt: skip


def _budget_section(ok: pd.DataFrame, memory: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    columns = ["method", "sp", "max_seq_len_in_budget", "paper_max_seq_len_in_budget"]
    rows = _sorted(ok).drop_duplicates(["method", "sp"])[columns]
    first = ok.iloc[0]
    budget, layers = first["memory_budget_bytes"], int(first["budget_layers"])
    longest: dict[str, Any] = {}
    for row in rows.itertuples():
        longest.setdefault(row.method, {})[int(row.sp)] = {
            "model": int(row.max_seq_len_in_budget),
            "paper": int(row.paper_max_seq_len_in_budget),
        }
    table = pd.DataFrame({
        "method": rows["method"].map(_name), "P": rows["sp"],
        "longest s (implementation model, validated)": rows["max_seq_len_in_budget"],
        "longest s (paper formula)": rows["paper_max_seq_len_in_budget"],
    })  # fmt: skip
    text = (
        "## Longest sequence within the memory budget\n\n"
        f"The largest s whose activations for {layers} such blocks fit in "
        f"{format_bytes(budget)} per rank (weights, gradients and optimizer state not "
        "included), from the implementation model — the model the measured rows above "
        f"check, matched to within {_pct(memory['max_error'])} — and, for comparison, from "
        f"the paper formula ({PAPER_MEMORY}). These are the model's extrapolation, not runs "
        "at those lengths, and they count what is saved for backward only: transient "
        "working memory — collective buffers, and Ring Attention's score block of "
        "b·a·(s/P)² floats per ring step, which this implementation computes with plain "
        "matmuls rather than a fused kernel — comes on top.\n\n"
        f"{markdown_table(table)}\n"
    )
    return text, {"memory_budget_bytes": budget, "layers": layers, "longest": longest}


def _time_section(ok: pd.DataFrame) -> str:
    rows = _sorted(ok)
    table = pd.DataFrame({
        "method": rows["method"].map(_name), "P": rows["sp"], "s": rows["seq_len"],
        "step time (fwd + bwd, slowest rank, median)": rows["step_time_s"].map(format_seconds),
    })  # fmt: skip
    cores = pd.to_numeric(ok.get("host_cores"), errors="coerce").max() if len(ok) else math.nan
    stretched = (f"this host has {int(cores)} cores, so cells with P > {int(cores)} share "
                 "them and their wall clock is stretched by the sharing, not the "
                 "method" if math.isfinite(cores) else "ranks may share cores")  # fmt: skip
    return (
        "## Step time\n\nOne layer's forward + backward, barrier-opened, the slowest rank's "
        f"time, median of the repeats. Wall clock: {stretched}; the communication and "
        "memory figures above do not depend on the machine. Megatron-SP and Ulysses "
        "attend with torch's fused attention kernel; Ring Attention's blocks are plain "
        "matmuls with an online softmax, so on one host it pays for the (s/P)² score "
        "blocks that the fused kernel tiles away.\n\n"
        f"{markdown_table(table)}\n"
    )


def _correctness_section(ok: pd.DataFrame) -> tuple[str, int]:
    wrong = int(np.nansum(pd.to_numeric(ok["wrong"], errors="coerce")))
    rows = _sorted(ok)
    tolerance = float(ok["tolerance"].max())
    table = pd.DataFrame({
        "method": rows["method"].map(_name), "P": rows["sp"], "s": rows["seq_len"],
        "padded positions": rows["padded_positions"],
        "max normalised error": rows["max_error"].map(lambda v: f"{v:.2g}"),
        "wrong": rows["wrong"],
    })  # fmt: skip
    verdict = "every cell matched" if wrong == 0 else f"**{wrong} tensor(s) wrong**"
    return (
        "## Correctness\n\nEach rank's output and input gradient (its real positions) and "
        "every weight gradient (replicated ones summed over ranks, tensor-parallel shards "
        "against their block of the full gradient) against the full single-device block on "
        "the same input and output gradient. Error = max|got − want| / max|want| (a weight "
        "gradient's scale is at least 1/1000 of the block's largest: k_proj's bias has a "
        f"zero gradient); `wrong` counts tensors above {tolerance:g} (float32 sums in "
        f"another order move results by ~1e-6; a misplaced head or block by O(1)): {verdict}.\n\n{markdown_table(table)}\n"
    ), wrong


def _figures(comm: dict, ratio: dict | None, memory: dict, budget: dict, wrong: int,
             failed: int) -> list[dict]:  # fmt: skip
    figures = []
    if ratio is not None:
        figures.append(figure_row(
            f"Ulysses ÷ Megatron-SP bytes per link per layer, P = {ratio['sp']}",
            f"1/P = {ratio['formula']:.4f}", RATIO_SOURCE, f"{ratio['measured']:.4f}",
            f"{ratio['measured'] - ratio['formula']:+.4f}"))  # fmt: skip
    if comm.get("rows"):
        figures.append(figure_row(
            "rows (P > 1) whose counted bytes per link equal the formula", "all", COMM_SOURCE,
            f"{comm['exact_rows']} of {comm['rows']}", f"{comm['exact_rows'] - comm['rows']:+d}"))  # fmt: skip
    if memory:
        figures.append(figure_row(
            "activation bytes per rank vs the implementation model, worst row", "0%",
            MODEL_MEMORY, _pct(memory["max_error"]), _pct(memory["max_error"])))  # fmt: skip
        figures.append(figure_row(
            "activation bytes per rank, measured ÷ paper formula (range over rows)", "1×",
            PAPER_MEMORY, f"{format_ratio(memory['vs_paper_min'])} … "
            f"{format_ratio(memory['vs_paper_max'])}", "fp32, fused attention: see report"))  # fmt: skip
    for method, by_sp in budget.get("longest", {}).items():
        sp = max(by_sp)
        entry = by_sp[sp]
        gap = format_ratio(entry["model"] / entry["paper"]) if entry["paper"] else "—"
        figures.append(figure_row(
            f"{_name(method)}: longest s within {format_bytes(budget['memory_budget_bytes'])} "
            f"per rank, {budget['layers']} layers, P = {sp} (validated implementation model)",
            f"{entry['paper']:,}", f"{PAPER_MEMORY} formula",
            f"{entry['model']:,} (model, not run)", gap))  # fmt: skip
    figures.append(figure_row("wrong tensors", "0", "single-device block", str(wrong),
                              f"{wrong:+d}"))  # fmt: skip
    figures.append(figure_row("failed cells", "0", "grid", str(failed), f"{failed:+d}"))
    return figures


def write_report(df: pd.DataFrame, report_dir: Path) -> dict[str, Any]:
    """Write report.md, comm_per_link.png, ulysses_vs_megatron.png, activation_per_rank.png
    and headline.json."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    ok = ok_rows(df)
    failures = failures_list(df, ["method", "sp", "seq_len"])
    parts = ["# Sequence parallelism: communication per link and activation memory per rank\n"]
    comm: dict[str, Any] = {}
    ratio, memory, budget, wrong = None, {}, {}, 0
    if ok.empty:
        parts.append("No cell finished; nothing was measured.\n")
    else:
        parts.append(_setup_section(df, ok))
        comm_text, comm = _comm_section(ok, report_dir)
        ratio_text, ratio = _ratio_section(ok, report_dir)
        memory_text, memory = _memory_section(ok, report_dir)
        budget_text, budget = _budget_section(ok, memory)
        correctness_text, wrong = _correctness_section(ok)
        parts += [comm_text, ratio_text, memory_text, budget_text, _time_section(ok),
                  correctness_text]  # fmt: skip
    parts.append(failed_cells_markdown(failures))
    write_text_atomic(report_dir / "report.md", "\n".join(parts))
    headline = {
        "experiment": "sequence_parallel",
        "ulysses_vs_megatron_per_link": ratio,
        "comm_rows_equal_formula": comm,
        "activation_model_error": memory,
        "longest_seq_len_in_budget": budget,
        "wrong_total": wrong,
        "failed_cells": len(failures),
        "failures": failures,
        "figures": _figures(comm, ratio, memory, budget, wrong, len(failures)),
    }
    write_headline(report_dir, headline)
    return to_jsonable(headline)
