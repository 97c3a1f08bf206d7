"""Report for `zero_memory`: measured per-rank memory and traffic of DP and ZeRO-1/2/3.

The ZeRO paper (Rajbhandari et al. 2019) predicts each rank's model states — weights,
gradients, optimizer state — per stage (§5, drawn as stacked bars in its Figure 1) and the
traffic per step (§7: plain DP, ZeRO-1 and ZeRO-2 move 2Ψ, ZeRO-3 3Ψ). This writer draws
the measured model states the same way with the cost model's total as a marker, tabulates
measured against predicted bytes, expresses the counted traffic in units of Ψ, compares
step time with torch's DDP, ZeroRedundancyOptimizer and FSDP2 `fully_shard` run on the
same model and ranks, and lists failed cells. Measured numbers come from the results; the
predictions come from the experiment's cost-model columns; theory is labelled with its
source.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
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

__all__ = ["COMM_THEORY", "METHODS", "TARGETS", "write_report"]

METHODS = {
    "dp": "DP",
    "ddp": "DDP (buckets, overlapped)",
    "ddp_no_overlap": "DDP (buckets, no overlap)",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2",
    "zero3": "ZeRO-3",
    "torch_ddp": "torch DDP",
    "torch_zero_redundancy": "torch ZeroRedundancyOptimizer",
    "torch_fsdp2": "torch FSDP2",
}
# Tick labels of the memory figure (torch's names shortened so that they fit a bar).
SHORT = {
    **{m: label for m, label in METHODS.items() if not m.startswith("torch")},
    "torch_ddp": "torch DDP",
    "torch_zero_redundancy": "torch ZeRO-1",
    "torch_fsdp2": "torch FSDP2",
}
# distbench method -> torch's implementation of the same stage; a row's own `twin` column,
# when the experiment writes one, takes precedence.
TORCH_TWIN = {
    "dp": "torch_ddp",
    "ddp": "torch_ddp",
    "ddp_no_overlap": "torch_ddp",
    "zero1": "torch_zero_redundancy",
    "zero3": "torch_fsdp2",
}
COMM_THEORY = {0: 2, 1: 2, 2: 2, 3: 3}  # Ψ per rank per step as N → ∞, ring collectives
COMM_SOURCE = "ZeRO paper (Rajbhandari et al. 2019), §7, ring collectives"
MEMORY_SOURCE = "issue #4; cost model = ZeRO paper §5"
# The done-when: (target, source). The DDP speed target is the overlapped DDP's
# (`ddp`); plain `dp` stands in for it when a run has no `ddp` rows.
TARGETS = {
    "model_state_error": (0.05, "issue #4: measured model states within 5% of the cost model"),
    "zero3": (1.25, "issue #4: ZeRO-3 step time ≤ 1.25× FSDP2 fully_shard"),
    "ddp": (1.1, "issue #4: overlapped DDP step time ≤ 1.1× torch DDP"),
    "ddp_vs_no_overlap": (1.0, "issue #4: overlapped DDP faster than DDP without overlap"),
}
PARTS = {"param_bytes": "weights", "grad_bytes": "gradients", "optim_bytes": "optimizer"}
PART_COLOURS = {"param_bytes": "#4C72B0", "grad_bytes": "#DD8452", "optim_bytes": "#55A868"}


def _methods(df: pd.DataFrame) -> list[str]:
    present = {str(m) for m in pd.unique(df["method"])}
    return [m for m in METHODS if m in present] + sorted(present - set(METHODS))


def _pct(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{100 * value:.2f}%"


def _psi(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.3f}Ψ"


def _ours(ok: pd.DataFrame) -> pd.DataFrame:
    return ok[ok["impl"] == "distbench"]


def _setup_section(df: pd.DataFrame) -> str:
    ns = sorted(int(n) for n in df["world_size"].dropna().unique())
    precisions = ", ".join(str(p) for p in pd.unique(df["precision"].dropna()))
    psi = ", ".join(f"{int(p):,}" for p in sorted(df["params"].dropna().unique()))
    methods = ", ".join(METHODS.get(m, m) for m in _methods(df))
    return (
        "## What was measured, on what\n\n"
        f"Methods {methods} on N ∈ {{{', '.join(map(str, ns))}}} ranks, precision "
        f"{precisions}, one model of Ψ = {psi} parameters. {run_context(df)} Per-rank "
        "memory is measured (on CPU an exact accounting of the tensors each rank holds; on "
        "GPU the allocator's peak); the predictions beside it are the cost model "
        "`impls.costmodel.memory` for the same Ψ, stage, N and precision; traffic is "
        "counted by distbench's communicator, exactly. torch's rows hold what can be "
        "observed from outside (NaN elsewhere).\n"
    )


def _plot_memory(ok: pd.DataFrame, path: Path) -> None:
    """Stacked weights / gradients / optimizer per method, one panel per (precision, N)."""
    rows = ok.dropna(subset=list(PARTS))
    precisions = list(pd.unique(rows["precision"]))
    ns = sorted(int(n) for n in rows["world_size"].unique())
    fig, axes = new_figure(3.2 * len(ns) + 1.5, 3.8 * len(precisions), len(precisions),
                           len(ns), sharey="row")  # fmt: skip
    for i, precision in enumerate(precisions):
        for j, n in enumerate(ns):
            ax = axes[i * len(ns) + j]
            cell = rows[(rows["precision"] == precision) & (rows["world_size"] == n)]
            methods = _methods(cell)
            x = np.arange(len(methods))
            bottom = np.zeros(len(methods))
            for part, colour in PART_COLOURS.items():
                values = [float(cell[cell["method"] == m][part].iloc[0]) for m in methods]
                ax.bar(x, values, bottom=bottom, color=colour, width=0.7)
                bottom += values
            predicted = [float(cell[cell["method"] == m]["predicted_model_state_bytes"].iloc[0])
                         for m in methods]  # fmt: skip
            ax.scatter(x, predicted, marker="D", color="black", zorder=5, s=24)
            ax.set_xticks(x, [SHORT.get(m, m) for m in methods], rotation=40, ha="right",
                          fontsize=8)  # fmt: skip
            ax.set_title(f"{precision}, N = {n}")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    handles = [Patch(color=c, label=PARTS[p]) for p, c in PART_COLOURS.items()]
    handles.append(Line2D([], [], marker="D", color="black", linestyle="",
                          label="predicted total (cost model)"))  # fmt: skip
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4)
    fig.suptitle("Model states per rank, measured (bars) vs cost model (◆), as ZeRO Fig. 1")
    fig.subplots_adjust(hspace=0.55)
    save_figure(fig, path)


def _memory_section(ok: pd.DataFrame, plotted: bool) -> tuple[str, dict[str, Any]]:
    measured = [*PARTS, "model_state_bytes", "gathered_peak_bytes", "peak_bytes"]
    # A torch row whose memory could not be observed would be a line of dashes: left out.
    rows = ok[ok[measured].notna().any(axis=1)].sort_values(["precision", "world_size", "stage"])
    error = rows["model_state_bytes"] / rows["predicted_model_state_bytes"] - 1
    table = pd.DataFrame({
        "method": rows["method"].map(lambda m: METHODS.get(m, m)),
        "N": rows["world_size"].astype(int),
        "precision": rows["precision"],
        **{title: rows[part].map(format_bytes) for part, title in PARTS.items()},
        "model states": rows["model_state_bytes"].map(format_bytes),
        "predicted": rows["predicted_model_state_bytes"].map(format_bytes),
        "error": error.map(_pct),
        "gathered peak": rows["gathered_peak_bytes"].map(format_bytes),
        "activations peak": rows["activation_peak_bytes"].map(format_bytes),
        "peak": rows["peak_bytes"].map(format_bytes),
    })  # fmt: skip
    ours = _ours(rows)
    ours_error = (ours["model_state_bytes"] / ours["predicted_model_state_bytes"] - 1).abs()
    by_method = ours_error.groupby(ours["method"]).max().dropna()
    worst = float(by_method.max()) if len(by_method) else None
    target = TARGETS["model_state_error"][0]
    verdict = (
        "no distbench row has both values"
        if worst is None
        else f"**{_pct(worst)}** ({'within' if worst <= target else 'outside'} the {target:.0%} "
        "target)"
    )
    per_method = ", ".join(f"{METHODS.get(m, m)} {_pct(e)}" for m, e in by_method.items())
    text = (
        "## Per-rank memory: measured vs the cost model\n\n"
        + ("![model states per rank](memory_per_rank.png)\n\n" if plotted else "")
        + "error = measured / predicted − 1 of the model states (weights + gradients + "
        f"optimizer). Largest |error| over distbench's stages and N: {verdict}"
        f"{'; per method: ' + per_method if per_method else ''}. Gathered peak is ZeRO-3's "
        "transient all-gathered weights; peak is the most the rank held at once in the "
        "step (model states + transients + saved activations).\n\n"
        f"{markdown_table(table)}\n"
    )
    return text, {"max": worst, "by_method": {m: float(e) for m, e in by_method.items()}}


def _theory_multiple(stage: int, n: int) -> float:
    return COMM_THEORY[stage] * (n - 1) / n


def _comm_rows(ok: pd.DataFrame) -> pd.DataFrame:
    rows = _ours(ok).dropna(subset=["comm_psi_multiple"]).sort_values(["world_size", "stage"])
    theory = [_theory_multiple(int(s), int(n)) for s, n in zip(rows["stage"], rows["world_size"],
                                                              strict=True)]  # fmt: skip
    return rows.assign(theory_multiple=theory)


def _plot_comm(rows: pd.DataFrame, path: Path) -> None:
    fig, (ax,) = new_figure(6.5, 4.2)
    ns = sorted(int(n) for n in rows["world_size"].unique())
    grid = np.linspace(min(ns), max(ns), 100)
    for multiple, style in ((2, "--"), (3, ":")):
        ax.plot(grid, multiple * (grid - 1) / grid, color="grey", linestyle=style,
                label=f"theory {multiple}Ψ·(N−1)/N")  # fmt: skip
    # Stages 0–2 coincide when they meet the theory: shrinking markers keep each visible.
    for i, (method, group) in enumerate(rows.groupby("method", sort=False)):
        ax.plot(group["world_size"], group["comm_psi_multiple"], marker="osD^v"[i % 5],
                markersize=9 - 1.5 * (i % 4), label=f"{METHODS.get(method, method)} (counted)")  # fmt: skip
    log2_axis(ax, ns)
    ax.set(xlabel="ranks N", ylabel="bytes sent per rank per step / (Ψ · bytes per element)",
           title="Traffic per rank per step, in units of Ψ")  # fmt: skip
    ax.legend(fontsize="small")
    save_figure(fig, path)


def _comm_section(rows: pd.DataFrame) -> tuple[str, dict[str, dict[str, Any]]]:
    if rows.empty:
        return "## Communication per rank per step\n\nNo distbench row was counted.\n", {}
    table = pd.DataFrame({
        "method": rows["method"].map(lambda m: METHODS.get(m, m)),
        "N": rows["world_size"].astype(int),
        "precision": rows["precision"],
        "sent (counted)": rows["comm_bytes_per_step"].map(format_bytes),
        "predicted": rows["predicted_comm_bytes_per_step"].map(format_bytes),
        "counted multiple": rows["comm_psi_multiple"].map(_psi),
        "theory": [f"{COMM_THEORY[int(s)]}Ψ·(N−1)/N = {_psi(t)}"
                   for s, t in zip(rows["stage"], rows["theory_multiple"], strict=True)],
    })  # fmt: skip
    at_largest = {}
    for method, group in rows.groupby("method", sort=False):
        row = group.loc[group["world_size"].idxmax()]
        n, stage = int(row["world_size"]), int(row["stage"])
        at_largest[str(method)] = {
            "world_size": n,
            "measured": float(row["comm_psi_multiple"]),
            "theory": float(row["theory_multiple"]),
            "theory_limit": COMM_THEORY[stage],
            # ×N/(N−1) undoes the ring's (N−1)/N: comparable with the paper's 2Ψ / 3Ψ.
            "normalised": float(row["comm_psi_multiple"]) * n / (n - 1) if n > 1 else None,
        }
    text = (
        "## Communication per rank per step\n\n"
        f"Theory ({COMM_SOURCE}): DP all-reduces the gradients, ZeRO-1 and ZeRO-2 "
        "reduce-scatter them and all-gather the updated weights — 2Ψ either way; ZeRO-3 "
        "all-gathers each unit's weights for its forward and again for its backward and "
        "reduce-scatters its gradients — 3Ψ. A ring collective sends (N−1)/N of its buffer "
        "per rank, so the counters should read 2Ψ·(N−1)/N and 3Ψ·(N−1)/N (plus padding to "
        "multiples of N). Counted multiple = bytes sent per rank per step / (Ψ · bytes per "
        "element), from the experiment's counters.\n\n![traffic per rank](comm_per_rank.png)\n\n"
        f"{markdown_table(table)}\n"
    )
    return text, at_largest


def _twin(ok: pd.DataFrame, method: str) -> str:
    """The torch method `method` is compared with ("" if none)."""
    if "twin" in ok.columns:
        named = ok.loc[ok["method"] == method, "twin"].dropna()
        named = named[named != ""]
        if len(named):
            return str(named.iloc[0])
    return TORCH_TWIN.get(method, "")


def _ddp_method(methods: list[str]) -> str:
    """Which method the DDP speed target applies to: the overlapped DDP, else plain DP."""
    return "ddp" if "ddp" in methods else "dp"


def _worst_ratio(rows: pd.DataFrame, other: pd.DataFrame, basis: str) -> dict[str, Any] | None:
    """The largest step-time ratio of `rows` to `other` in the same (N, precision)."""
    merged = rows.merge(other, on=["world_size", "precision"], suffixes=("", "_other"))
    merged = merged.assign(ratio=merged["step_time_s"] / merged["step_time_s_other"])
    merged = merged.dropna(subset=["ratio"])
    if merged.empty:
        return None
    worst = merged.loc[merged["ratio"].idxmax()]
    return {"ratio": float(worst["ratio"]), "world_size": int(worst["world_size"]),
            "precision": str(worst["precision"]), "basis": basis}  # fmt: skip


def _fair(ok: pd.DataFrame) -> pd.DataFrame:
    """The cells whose ranks each had a core (1 < N ≤ the host's cores), where wall clock
    is a fair race; all cells if the run has none."""
    if "host_cores" not in ok.columns:
        return ok
    fair = ok[(ok["world_size"] > 1) & (ok["world_size"] <= ok["host_cores"])]
    return fair if not fair.empty else ok


def _ratio_entry(ok: pd.DataFrame, method: str) -> dict[str, Any] | None:
    """The worst (largest) step-time ratio of `method` to its torch twin over the N with a
    core per rank: paired (timed side by side in one cell) where the run has it, else from
    the twin's own cell."""
    twin = _twin(ok, method)
    ok = _fair(ok)
    rows = ok[ok["method"] == method]
    paired = rows.dropna(subset=["step_time_vs_torch"])
    if not paired.empty:
        worst = paired.loc[paired["step_time_vs_torch"].idxmax()]
        return {"ratio": float(worst["step_time_vs_torch"]), "world_size": int(worst["world_size"]),
                "precision": str(worst["precision"]), "basis": "paired", "twin": twin}  # fmt: skip
    entry = _worst_ratio(rows, ok[ok["method"] == twin], "separate cells")
    return None if entry is None else {**entry, "twin": twin}


def _overlap_entry(ok: pd.DataFrame) -> dict[str, Any] | None:
    """Overlapped DDP ÷ the same DDP without overlap, worst over N: paired (the `ddp` cell
    times both in alternating steps) where the run has it, else from separate cells."""
    rows = ok[ok["method"] == "ddp"]
    if "step_time_vs_no_overlap" in rows.columns:
        paired = rows.dropna(subset=["step_time_vs_no_overlap"])
        if not paired.empty:
            worst = paired.loc[paired["step_time_vs_no_overlap"].idxmax()]
            return {"ratio": float(worst["step_time_vs_no_overlap"]),
                    "world_size": int(worst["world_size"]),
                    "precision": str(worst["precision"]), "basis": "paired"}  # fmt: skip
    return _worst_ratio(rows, ok[ok["method"] == "ddp_no_overlap"], "separate cells")


def _ratio_line(label: str, entry: dict[str, Any] | None, goal: str) -> str:
    if entry is None:
        return f"- {label}: not measured"
    return (
        f"- {label}: {format_ratio(entry['ratio'])} worst over N (N = {entry['world_size']}, "
        f"{entry['precision']}, {entry['basis']}){goal}"
    )


def _time_section(ok: pd.DataFrame) -> tuple[str, dict[str, Any]]:
    rows = ok.sort_values(["precision", "world_size", "stage"])
    table = pd.DataFrame({
        "method": rows["method"].map(lambda m: METHODS.get(m, m)),
        "N": rows["world_size"].astype(int),
        "precision": rows["precision"],
        "step time": rows["step_time_s"].map(format_seconds),
        "torch twin": rows["method"].map(lambda m: METHODS.get(_twin(ok, m), "—")),
        "twin step time (paired)": rows["torch_step_time_s"].map(format_seconds),
        "ratio": rows["step_time_vs_torch"].map(format_ratio),
    })  # fmt: skip
    present = [m for m in _methods(ok) if m in TORCH_TWIN]
    targets = {"zero3": TARGETS["zero3"][0], _ddp_method(present): TARGETS["ddp"][0]}
    ratios: dict[str, Any] = {m: _ratio_entry(ok, m) for m in present}
    lines = []
    for method, entry in ratios.items():
        twin = _twin(ok, method)
        goal = f" (target ≤ {targets[method]:g}×)" if method in targets else ""
        lines.append(_ratio_line(f"{METHODS[method]} ÷ {METHODS.get(twin, twin)}", entry, goal))
    overlap = _overlap_entry(_fair(ok))
    if overlap is not None:
        ratios["ddp_vs_no_overlap"] = {**overlap, "twin": "ddp_no_overlap"}
        label = f"{METHODS['ddp']} ÷ {METHODS['ddp_no_overlap']}"
        lines.append(_ratio_line(label, overlap, " (target < 1×: the overlap must pay)"))
    text = (
        "## Step time against torch\n\n"
        "Step time as the experiment measured it (`step_time_s`); the twin is torch's "
        "implementation of the same stage on the same model and ranks, timed side by side "
        "in one cell where the basis says paired, else taken from the twin's own cell. "
        "Wall clock on shared cores is CPU-bound (see the setup above), so the ratios below "
        "are the worst over the N at which every rank had a core of its own; the table "
        "has every N.\n\n" + "\n".join(lines) + f"\n\n{markdown_table(table)}\n"
    )
    return text, ratios


def _correctness_section(ok: pd.DataFrame) -> tuple[str, int]:
    wrong = int(np.nansum(pd.to_numeric(ok["wrong"], errors="coerce")))
    rows = ok.sort_values(["precision", "world_size", "stage"])
    table = pd.DataFrame({
        "method": rows["method"].map(lambda m: METHODS.get(m, m)),
        "N": rows["world_size"].astype(int),
        "precision": rows["precision"],
        "loss": rows["loss"].map(lambda v: "—" if not math.isfinite(v) else f"{v:.6g}"),
        "max param diff vs reference": rows["max_param_diff"].map(
            lambda v: "—" if not math.isfinite(v) else f"{v:.3g}"),
        "wrong": rows["wrong"].map(lambda v: "—" if not math.isfinite(v) else str(int(v))),
    })  # fmt: skip
    verdict = "every cell matched" if wrong == 0 else f"**{wrong} cell(s) wrong**"
    return (
        "## Correctness\n\nEach run's parameters after its training steps against the "
        "single-process "
        f"reference; `wrong` flags a cell outside the experiment's tolerance: {verdict}.\n\n"
        f"{markdown_table(table)}\n"
    ), wrong


def _figures(memory: dict, comm: dict, ratios: dict, wrong: int, failed: int) -> list[dict]:
    figures = []
    if memory["max"] is not None:
        target = TARGETS["model_state_error"][0]
        figures.append(figure_row(
            "model-state bytes per rank, largest error (measured / predicted − 1) over stages, N",
            f"≤ {target:.0%}", MEMORY_SOURCE, _pct(memory["max"]),
            f"{100 * (memory['max'] - target):+.2f} pts",
        ))  # fmt: skip
    for method, entry in comm.items():
        n, limit = entry["world_size"], entry["theory_limit"]
        figures.append(figure_row(
            f"{METHODS.get(method, method)} traffic per rank per step, N = {n}",
            f"{limit}Ψ (×(N−1)/N = {_psi(entry['theory'])})", COMM_SOURCE,
            _psi(entry["measured"]), _psi(entry["measured"] - entry["theory"]),
        ))  # fmt: skip
    ddp = _ddp_method(list(ratios))
    speed = [("zero3", "zero3"), (ddp, "ddp"), ("ddp_vs_no_overlap", "ddp_vs_no_overlap")]
    for key, target_key in speed:
        entry = ratios.get(key)
        if entry is None:
            continue
        target, source = TARGETS[target_key]
        method = "ddp" if key == "ddp_vs_no_overlap" else key
        name = f"{METHODS[method]} step time ÷ {METHODS.get(entry['twin'], entry['twin'])}"
        bound = f"< {target:g}×" if key == "ddp_vs_no_overlap" else f"≤ {target:g}×"
        figures.append(figure_row(
            f"{name} (worst over N, N = {entry['world_size']})", bound, source,
            format_ratio(entry["ratio"]), f"{entry['ratio'] - target:+.2f}×",
        ))  # fmt: skip
    figures.append(figure_row("wrong cells", "0", "single-process reference", str(wrong),
                              f"{wrong:+d}"))  # fmt: skip
    figures.append(figure_row("failed cells", "0", "grid", str(failed), f"{failed:+d}"))
    return figures


def write_report(df: pd.DataFrame, report_dir: Path) -> dict[str, Any]:
    """Write report.md, memory_per_rank.png, comm_per_rank.png and headline.json."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    ok = ok_rows(df)
    failures = failures_list(df, ["impl", "method", "stage", "world_size", "precision"])
    parts = ["# ZeRO memory: measured model states, traffic and speed per stage\n"]
    memory: dict[str, Any] = {"max": None, "by_method": {}}
    comm: dict[str, dict[str, Any]] = {}
    ratios: dict[str, Any] = {}
    wrong = 0
    if ok.empty:
        parts.append("No cell finished; nothing was measured.\n")
    else:
        parts.append(_setup_section(df))
        plotted = bool(ok[list(PARTS)].notna().all(axis=1).any())
        if plotted:
            _plot_memory(ok, report_dir / "memory_per_rank.png")
        memory_text, memory = _memory_section(ok, plotted)
        comm_rows = _comm_rows(ok)
        if not comm_rows.empty:
            _plot_comm(comm_rows, report_dir / "comm_per_rank.png")
        comm_text, comm = _comm_section(comm_rows)
        time_text, ratios = _time_section(ok)
        correctness_text, wrong = _correctness_section(ok)
        parts += [memory_text, comm_text, time_text, correctness_text]
    parts.append(failed_cells_markdown(failures))
    write_text_atomic(report_dir / "report.md", "\n".join(parts))
    target = TARGETS["model_state_error"][0]
    headline = {
        "experiment": "zero_memory",
        "model_state_error_max": memory["max"],
        "model_state_error_by_method": memory["by_method"],
        "model_state_within_target": None if memory["max"] is None else memory["max"] <= target,
        "comm_psi_multiple": comm,
        "step_time_vs_torch": ratios,
        "wrong_total": wrong,
        "failed_cells": len(failures),
        "failures": failures,
        "figures": _figures(memory, comm, ratios, wrong, len(failures)),
    }
    write_headline(report_dir, headline)
    return to_jsonable(headline)
