"""Report for `tensor_parallel`: Megatron TP's measured communication, memory and speed per
degree t, beside torch DTensor's `parallelize_module` and Megatron's analytic count.

Megatron-LM (Shoeybi et al., arXiv 1909.08053, §3) counts two all-reduces of the (b, s, h)
activations per transformer block in forward (`g` after attention and after the MLP) and
two in backward (`f` before each). This writer puts the counted collectives and bytes of
one block beside that count, draws them per t, tabulates per-rank memory and the paired
step-time ratio against DTensor, and lists failed cells. Every measured number comes from
the results; theory is labelled with its source.
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
    markdown_table,
    new_figure,
    ok_rows,
    run_context,
    save_figure,
    to_jsonable,
    write_headline,
    write_text_atomic,
)

__all__ = ["METHODS", "SPEED_TARGET", "write_report"]

METHODS = {"distbench": "distbench (Megatron layers)", "torch_dtensor": "torch DTensor"}
COLOURS = {"distbench": "#4C72B0", "torch_dtensor": "#DD8452"}
MEGATRON = "Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053) §3"
MEGATRON_ALLREDUCES = (2, 2)  # per transformer block: forward, backward
SPEED_TARGET = (2, 1.1, "issue #5: TP attention/MLP step at t=2 ≤ 1.1× DTensor parallelize_module")


def _methods(df: pd.DataFrame) -> list[str]:
    present = {str(m) for m in pd.unique(df["method"])}
    return [m for m in METHODS if m in present] + sorted(present - set(METHODS))


def _int(value: Any) -> str:
    return "—" if value is None or not math.isfinite(float(value)) else f"{int(value)}"


def _pct(value: float) -> str:
    return "—" if not math.isfinite(value) else f"{100 * value:+.2f}%"


def _setup_section(df: pd.DataFrame) -> str:
    first = df.iloc[0]
    ts = sorted(int(t) for t in df["tp"].unique())
    shape = ", ".join(
        f"{k}={_int(first[k])}" for k in ("d_model", "n_heads", "n_layers", "seq_len",
                                          "vocab_size") if k in df.columns
    )  # fmt: skip
    methods = ", ".join(METHODS.get(m, m) for m in _methods(df))
    cores = df["host_cores"].dropna() if "host_cores" in df.columns else pd.Series(dtype=float)
    stretched = [t for t in ts if len(cores) and t > int(cores.iloc[0])]
    caveat = (
        f" The host's {int(cores.iloc[0])} cores are split among the t ranks (each gets "
        "cores/t intra-op threads), so a step's total compute does not shrink as t grows "
        "here: step times across t show TP's communication and overheads, not its "
        "speed-up. Compare the methods at the same t."
        if len(cores)
        else ""
    )
    if stretched:
        caveat += (
            f" At t ∈ {{{', '.join(map(str, stretched))}}} there are more ranks than cores: "
            "ranks take turns on a core."
        )
    return (
        "## What was measured, on what\n\n"
        f"Methods {methods} at t ∈ {{{', '.join(map(str, ts))}}}, on one GPT ({shape}, "
        f"Ψ = {int(first['params']):,} parameters), batch {int(first['batch_size'])}. "
        f"{run_context(df)} A *layer* is one transformer block (attention + MLP). distbench's "
        "traffic is counted by its communicator, exactly; torch's collectives are counted by "
        "`CommDebugMode`, and their bytes are opaque to us (—). Memory is an exact "
        "accounting of the tensors one rank holds over a forward and backward of the block "
        "stack (parameters, gradients as they accumulate, tensors autograd saves; a DTensor "
        "counts its local shard). The timed step is that forward and backward: the "
        f"attention and MLP the issue names, not the embedding or the loss.{caveat}\n"
    )


def _comm_section(ok: pd.DataFrame) -> tuple[str, dict[str, Any]]:
    rows = ok.sort_values(["tp", "method"])
    fwd, bwd = MEGATRON_ALLREDUCES
    table = pd.DataFrame({
        "method": rows["method"].map(lambda m: METHODS.get(m, m)),
        "t": rows["tp"].astype(int),
        "all-reduces fwd": rows["allreduces_per_layer_fwd"].map(_int),
        "all-reduces bwd": rows["allreduces_per_layer_bwd"].map(_int),
        "Megatron": rows["tp"].map(lambda t: f"{fwd} + {bwd}" if t > 1 else "0 + 0"),
        "other collectives": (rows["collectives_per_layer"] - rows["allreduces_per_layer"])
        .map(_int),
        "bytes fwd": rows["comm_bytes_per_layer_fwd"].map(format_bytes),
        "bytes bwd": rows["comm_bytes_per_layer_bwd"].map(format_bytes),
        "predicted (each way)": rows["predicted_comm_bytes_per_layer_fwd"].map(format_bytes),
        "rounds fwd + bwd": (rows["comm_rounds_per_layer_fwd"]
                             + rows["comm_rounds_per_layer_bwd"]).map(_int),
    })  # fmt: skip
    ours = rows[rows["method"] == "distbench"]
    measured = ours["comm_bytes_per_layer_fwd"] + ours["comm_bytes_per_layer_bwd"]
    predicted = (
        ours["predicted_comm_bytes_per_layer_fwd"] + ours["predicted_comm_bytes_per_layer_bwd"]
    )
    bytes_match = bool(len(ours)) and bool((measured == predicted).all())
    counts_match = bool(len(ours)) and bool(
        (ours["allreduces_per_layer"] == ours["predicted_allreduces_per_layer"]).all()
    )
    summary: dict[str, Any] = {"distbench_bytes_match": bytes_match,
                               "distbench_allreduces_match": counts_match}  # fmt: skip
    for method in _methods(rows):
        parallel = rows[(rows["method"] == method) & (rows["tp"] > 1)]
        if len(parallel):
            last = parallel.iloc[-1]
            summary[method] = {
                "tp": int(last["tp"]),
                "allreduces_fwd": int(last["allreduces_per_layer_fwd"]),
                "allreduces_bwd": int(last["allreduces_per_layer_bwd"]),
                "bytes_fwd": last["comm_bytes_per_layer_fwd"],
                "bytes_bwd": last["comm_bytes_per_layer_bwd"],
                "predicted_bytes_fwd": last["predicted_comm_bytes_per_layer_fwd"],
            }
    dtensor = rows[(rows["method"] == "torch_dtensor") & (rows["tp"] > 1)]
    dtensor_note = ""
    if len(dtensor):
        extra = sorted(set((dtensor["allreduces_per_layer_bwd"] - bwd).astype(int)))
        if extra != [0]:
            dtensor_note = (
                f" DTensor's backward issued {', '.join(map(str, extra))} more all-reduce(s) "
                "per block than Megatron's count: with q, k and v each a separate "
                "ColwiseParallel layer, each reduces its own share of the input gradient, "
                "where distbench's attention puts one `f` in front of all three (the "
                "gradient arrives summed, so one all-reduce covers it)."
            )
    verdict = (
        "distbench's counted all-reduces and bytes equal the analytic count at every t"
        if bytes_match and counts_match
        else "**distbench's counted traffic differs from the analytic count** (see the table)"
    )
    text = (
        "## Communication per layer\n\n"
        f"Theory ({MEGATRON}): per block, {fwd} all-reduces of the b·s·h activations "
        f"forward and {bwd} backward; a ring all-reduce of M bytes sends 2(t−1)/t·M per "
        f"rank in 2(t−1) rounds. Measured over one block's forward and backward on the "
        f"busiest rank: {verdict}.{dtensor_note}\n\n"
        + markdown_table(table)
        + "\n\n![communication per layer](comm_per_layer.png)\n"
    )
    return text, summary


def _plot_comm(ok: pd.DataFrame, path: Path) -> None:
    """Left: distbench's bytes per block vs t, measured bars and the formula's markers.
    Right: all-reduces per block, forward and backward, per method and t."""
    fig, axes = new_figure(11, 4, 1, 2)
    ours = ok[(ok["method"] == "distbench") & (ok["tp"] > 1)].sort_values("tp")
    ax = axes[0]
    if len(ours):
        x = np.arange(len(ours))
        ax.bar(x - 0.2, ours["comm_bytes_per_layer_fwd"], 0.4, label="forward (measured)",
               color="#4C72B0")  # fmt: skip
        ax.bar(x + 0.2, ours["comm_bytes_per_layer_bwd"], 0.4, label="backward (measured)",
               color="#55A868")  # fmt: skip
        for offset, column in ((-0.2, "predicted_comm_bytes_per_layer_fwd"),
                               (0.2, "predicted_comm_bytes_per_layer_bwd")):  # fmt: skip
            ax.scatter(x + offset, ours[column], marker="D", color="black", zorder=5, s=24)
        ax.scatter([], [], marker="D", color="black", label="Megatron count, ring")
        ax.set_xticks(x, [f"t = {int(t)}" for t in ours["tp"]])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
        ax.legend(fontsize=8)
    ax.set_title("distbench: bytes sent per rank per block")
    ax = axes[1]
    parallel = ok[ok["tp"] > 1].sort_values(["tp", "method"])
    labels = [f"{METHODS.get(m, m).split(' (')[0]}\nt = {int(t)}"
              for m, t in zip(parallel["method"], parallel["tp"], strict=True)]  # fmt: skip
    x = np.arange(len(parallel))
    colours = [COLOURS.get(m, "grey") for m in parallel["method"]]
    ax.bar(x, parallel["allreduces_per_layer_fwd"], 0.6, color=colours, label="forward")
    ax.bar(x, parallel["allreduces_per_layer_bwd"], 0.6, bottom=parallel["allreduces_per_layer_fwd"],
           color=colours, alpha=0.5, hatch="//", label="backward")  # fmt: skip
    ax.axhline(sum(MEGATRON_ALLREDUCES), color="black", linestyle="--",
               label="Megatron: 2 + 2")  # fmt: skip
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("all-reduces per block")
    ax.set_title("collectives per block (solid: forward, hatched: backward)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def _memory_section(ok: pd.DataFrame) -> str:
    rows = ok.sort_values(["tp", "method"])
    table = pd.DataFrame({
        "method": rows["method"].map(lambda m: METHODS.get(m, m)),
        "t": rows["tp"].astype(int),
        "parameters": rows["param_bytes"].map(format_bytes),
        "saved activations (peak)": rows["activation_bytes"].map(format_bytes),
        "peak": rows["peak_bytes"].map(format_bytes),
    })  # fmt: skip
    return (
        "## Memory per rank\n\n"
        "The block stack's weights shrink by t except the replicated LayerNorms; saved "
        "activations shrink only inside attention and the MLP (their inputs, the LayerNorm "
        "outputs and the residual stream, stay whole on every rank, which Megatron-SP "
        "removes: see `sequence_parallel`).\n\n"
        + markdown_table(table)
        + "\n\n![memory per rank](memory_per_rank.png)\n"
    )


def _plot_memory(ok: pd.DataFrame, path: Path) -> None:
    fig, axes = new_figure(6, 4, 1, 1)
    ax = axes[0]
    for i, method in enumerate(_methods(ok)):
        rows = ok[ok["method"] == method].sort_values("tp")
        colour = COLOURS.get(method, "grey")
        label = METHODS.get(method, method)
        # Hollow, larger markers for the first method: where both hold the same bytes,
        # both stay visible.
        style = {"markersize": 11 - 4 * min(i, 1), "color": colour,
                 "markerfacecolor": "none" if i == 0 else colour}  # fmt: skip
        ax.plot(rows["tp"], rows["peak_bytes"], marker="o", label=f"{label}: peak", **style)
        ax.plot(rows["tp"], rows["param_bytes"], marker="s", linestyle=":",
                label=f"{label}: parameters", **style)  # fmt: skip
    ax.set_xscale("log", base=2)
    ts = sorted(int(t) for t in ok["tp"].unique())
    ax.set_xticks(ts, [str(t) for t in ts])
    ax.set_xlabel("tensor-parallel degree t")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    ax.set_title("per-rank memory over a forward + backward of the blocks")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def _time_section(ok: pd.DataFrame) -> tuple[str, dict[str, Any]]:
    rows = ok.sort_values(["tp", "method"])
    table = pd.DataFrame({
        "method": rows["method"].map(lambda m: METHODS.get(m, m)),
        "t": rows["tp"].astype(int),
        "step time": rows["step_time_s"].map(format_seconds),
        "other method, same run": rows["twin_step_time_s"].map(format_seconds),
        "ratio": rows["step_time_vs_twin"].map(format_ratio),
    })  # fmt: skip
    ratios: dict[str, Any] = {}
    for row in rows[(rows["method"] == "distbench")].itertuples():
        if math.isfinite(row.step_time_vs_twin):
            ratios[f"t={int(row.tp)}"] = float(row.step_time_vs_twin)
    t, target, source = SPEED_TARGET
    at_target = ratios.get(f"t={t}")
    verdict = (
        f"no paired distbench cell at t = {t}"
        if at_target is None
        else f"at t = {t} distbench's step takes {format_ratio(at_target)} DTensor's "
        f"({'within' if at_target <= target else '**outside**'} the ≤ {target}× target)"
    )
    text = (
        "## Step time\n\n"
        "Forward and backward of the transformer blocks on a replicated activation, the "
        "slowest rank, median over the timed steps; each distbench cell timed DTensor's "
        "blocks on twin weights in alternating steps, so the ratio is measured side by "
        f"side. {verdict} ({source}).\n\n"
        + markdown_table(table)
        + "\n\n![step time](step_time.png)\n"
    )
    return text, ratios


def _plot_time(ok: pd.DataFrame, path: Path) -> None:
    fig, axes = new_figure(6, 4, 1, 1)
    ax = axes[0]
    ts = sorted(int(t) for t in ok["tp"].unique())
    methods = _methods(ok)
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        rows = ok[ok["method"] == method].set_index("tp")
        values = [float(rows["step_time_s"].get(t, math.nan)) * 1e3 for t in ts]
        ax.bar(np.arange(len(ts)) + (i - (len(methods) - 1) / 2) * width, values, width,
               color=COLOURS.get(method, "grey"), label=METHODS.get(method, method))  # fmt: skip
    ax.set_xticks(np.arange(len(ts)), [f"t = {t}" for t in ts])
    ax.set_ylabel("step time (ms), blocks forward + backward")
    ax.set_title("step time per TP degree (same run)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def _correctness_section(ok: pd.DataFrame) -> tuple[str, int]:
    rows = ok.sort_values(["tp", "method"])
    wrong = int(rows["wrong"].sum())
    table = pd.DataFrame({
        "method": rows["method"].map(lambda m: METHODS.get(m, m)),
        "t": rows["tp"].astype(int),
        "update error": rows["update_error"].map(lambda v: f"{v:.1e}"),
        "largest loss difference": rows["loss_diff"].map(lambda v: f"{v:.1e}"),
        "wrong": rows["wrong"].astype(int),
    })  # fmt: skip
    text = (
        "## Correctness\n\n"
        f"Each cell trained {int(rows['steps'].iloc[0])} SGD steps on the whole batch and "
        "compared the gathered parameters with one process trained the same way: update "
        "error = ‖θ − θ_ref‖ / ‖θ_ref − θ₀‖ over the whole model; `wrong` when it exceeds "
        f"1e-4 (fp32 summed in another order). Wrong cells: **{wrong}**.\n\n"
        + markdown_table(table)
        + "\n"
    )
    return text, wrong


def _figures(comm: dict, ratios: dict, wrong: int, failed: int) -> list[dict[str, str]]:
    fwd, bwd = MEGATRON_ALLREDUCES
    figures = []
    for method in METHODS:
        entry = comm.get(method)
        if entry:
            measured = f"{entry['allreduces_fwd']} + {entry['allreduces_bwd']}"
            gap = (entry["allreduces_fwd"] - fwd) + (entry["allreduces_bwd"] - bwd)
            figures.append(figure_row(
                f"all-reduces per block fwd + bwd, {METHODS[method]}, t = {entry['tp']}",
                f"{fwd} + {bwd}", MEGATRON, measured, f"{gap:+d}",
            ))  # fmt: skip
    ours = comm.get("distbench")
    if ours:
        measured = ours["bytes_fwd"] + ours["bytes_bwd"]
        predicted = 2 * ours["predicted_bytes_fwd"]
        figures.append(figure_row(
            f"TP bytes per rank per block, t = {ours['tp']}",
            format_bytes(predicted), f"{MEGATRON}, ring all-reduce", format_bytes(measured),
            _pct(measured / predicted - 1) if predicted else "—",
        ))  # fmt: skip
    t, target, source = SPEED_TARGET
    if f"t={t}" in ratios:
        ratio = ratios[f"t={t}"]
        figures.append(figure_row(
            f"TP blocks step vs DTensor, t = {t}", f"≤ {target}×", source,
            format_ratio(ratio), f"{ratio - target:+.2f}×",
        ))  # fmt: skip
    figures.append(figure_row("wrong cells", "0", "single-process reference", str(wrong),
                              str(wrong)))  # fmt: skip
    if failed:
        figures.append(figure_row("failed cells", "0", "—", str(failed), str(failed)))
    return figures


def write_report(df: pd.DataFrame, report_dir: Path) -> dict[str, Any]:
    """Write report.md, comm_per_layer.png, memory_per_rank.png, step_time.png and
    headline.json."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    ok = ok_rows(df)
    failures = failures_list(df, ["method", "tp"])
    parts = ["# Tensor parallelism: Megatron layers vs DTensor, per TP degree\n"]
    comm: dict[str, Any] = {}
    ratios: dict[str, Any] = {}
    wrong = 0
    if ok.empty:
        parts.append("No cell finished; nothing was measured.\n")
    else:
        parts.append(_setup_section(ok))
        if (ok["tp"] > 1).any():
            _plot_comm(ok, report_dir / "comm_per_layer.png")
        comm_text, comm = _comm_section(ok)
        _plot_memory(ok, report_dir / "memory_per_rank.png")
        _plot_time(ok, report_dir / "step_time.png")
        time_text, ratios = _time_section(ok)
        correctness_text, wrong = _correctness_section(ok)
        parts += [comm_text, _memory_section(ok), time_text, correctness_text]
    parts.append(failed_cells_markdown(failures))
    write_text_atomic(report_dir / "report.md", "\n".join(parts))
    headline = {
        "experiment": "tensor_parallel",
        "comm_per_layer": comm,
        "step_time_vs_dtensor": ratios,
        "wrong_total": wrong,
        "failed_cells": len(failures),
        "failures": failures,
        "figures": _figures(comm, ratios, wrong, len(failures)),
    }
    write_headline(report_dir, headline)
    return to_jsonable(headline)
