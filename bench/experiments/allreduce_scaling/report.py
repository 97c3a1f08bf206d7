"""Report for `allreduce_scaling`: the lecture's aggregation table, measured.

The lecture ("Communication Primitives: Compare Different Distributed Aggregation") ranks
parameter server, sequential, ring and parallel all-reduce by time (rounds), peak per-node
bandwidth and total bandwidth in O(·). This writer fits a growth order to each counted
column, puts the lecture's order beside it, fits the α–β model to the measured times,
extrapolates it to 1024 ranks (labelled as a model) and compares busbw with
`torch.distributed.all_reduce` measured in the same run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter

from bench import analysis
from bench.analysis import GrowthFit, traffic_per_world_size
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

__all__ = ["LECTURE_ORDERS", "TORCH_RATIO_TARGET", "write_report"]

LECTURE_SOURCE = "lecture, Communication Primitives: Compare Different Distributed Aggregation"
LECTURE_ORDERS: dict[str, dict[str, str]] = {
    "parameter_server": {"rounds": "O(1)", "peak": "O(N)", "total": "O(N)"},
    "sequential": {"rounds": "O(N)", "peak": "O(N)", "total": "O(N)"},
    "ring": {"rounds": "O(N)", "peak": "O(1)", "total": "O(N)"},
    "parallel": {"rounds": "O(1)", "peak": "O(N)", "total": "O(N^2)"},
    "recursive_halving": {"rounds": "O(log N)"},  # the lecture gives only its time
}
COLUMNS = {"rounds": "time (rounds)", "peak": "peak node bytes / M", "total": "total bytes / M"}
LECTURE_COLUMNS = {"rounds": "time", "peak": "peak node bandwidth", "total": "total bandwidth"}
ALGORITHM_ORDER = (*LECTURE_ORDERS, "tree", "torch")
TORCH_RATIO_TARGET = 0.9  # the target for ring busbw against torch's all_reduce
HEADLINE_CELL = (4, 64 * 2**20)  # (world_size, message_bytes) the headline ratio prefers


def _algorithms(df: pd.DataFrame) -> list[str]:
    present = {str(a) for a in pd.unique(df["algorithm"])}
    extra = sorted(present - set(ALGORITHM_ORDER))
    return [a for a in ALGORITHM_ORDER if a in present] + extra


def _palette(algorithms: list[str]) -> dict[str, Any]:
    colours = sns.color_palette("tab10", len(algorithms))
    return {a: ("black" if a == "torch" else c) for a, c in zip(algorithms, colours, strict=True)}


def _lecture_order(algorithm: str, column: str) -> str:
    if algorithm not in LECTURE_ORDERS:
        return "not in lecture"
    return LECTURE_ORDERS[algorithm].get(column, "not in lecture (time only)")


def _setup_section(df: pd.DataFrame) -> str:
    sizes = sorted(df["world_size"].dropna().astype(int).unique())
    messages = sorted(df["message_bytes"].dropna().astype(int).unique())
    dtypes = ", ".join(str(d) for d in pd.unique(df["dtype"].dropna())) if "dtype" in df else "?"
    return (
        "## What was measured, on what\n\n"
        f"Each algorithm all-reduced a {dtypes} buffer of M = {format_bytes(messages[0])} … "
        f"{format_bytes(messages[-1])} on N ∈ {{{', '.join(map(str, sizes))}}} ranks, with "
        "`torch.distributed.all_reduce` measured in the same run as the baseline. "
        f"{run_context(df)} `time_s` is the median over repeats of the slowest rank's time per "
        "call (nccl-tests convention); algbw = M / time and busbw = algbw × 2(N−1)/N. The "
        "traffic counters are exact and do not depend on the machine.\n"
    )


def _cell(fit: GrowthFit | None, lecture: str) -> tuple[str, str]:
    if fit is None:
        return "n/a (needs ≥ 3 world sizes)", "—"
    if lecture.startswith("not in lecture"):
        return f"{fit.order}: {fit.formula}", "—"
    return f"{fit.order}: {fit.formula}", "✓" if fit.order == lecture else "✗"


def _growth_section(df: pd.DataFrame) -> tuple[str, dict[str, dict[str, bool]], dict]:
    traffic = traffic_per_world_size(df)
    fits = analysis.fit_traffic_growth(traffic)
    algorithms = _algorithms(traffic) if not traffic.empty else []
    summary, detail, matches = [], [], {}
    all_sizes = sorted(int(n) for n in traffic["world_size"].unique())
    header = f"measured at N = {', '.join(map(str, all_sizes))}"
    for algorithm in algorithms:
        measured = traffic[traffic["algorithm"] == algorithm].set_index("world_size")
        row = {"algorithm": algorithm}
        for column, title in COLUMNS.items():
            lecture = _lecture_order(algorithm, column)
            fit = fits.get(algorithm, {}).get(column)
            fitted, mark = _cell(fit, lecture)
            source = {"rounds": "rounds", "peak": "peak_per_M", "total": "total_per_M"}[column]
            values = " / ".join(
                f"{measured.at[n, source]:.3g}" if n in measured.index else "—" for n in all_sizes
            )
            detail.append(
                {
                    "algorithm": algorithm,
                    "quantity": title,
                    header: values,
                    "fitted (measured)": fitted,
                    "lecture": lecture,
                    "match": mark,
                }
            )
            said = lecture if mark == "—" else f"lecture {lecture} {mark}"
            row[title] = f"{fit.order if fit else 'n/a'} · {said}"
            if mark in ("✓", "✗"):
                matches.setdefault(algorithm, {})[column] = mark == "✓"
        summary.append(row)
    text = (
        "## The lecture's comparison table, reproduced\n\n"
        "Rounds are the most communication rounds any rank took; bytes are in units of the "
        "message size M (peak: the busiest rank's max of sent and received; total: sent, "
        "summed over ranks), each the median over message sizes. The growth order is fitted "
        f"to the counts (best of a·f(N) + b); the lecture's order is from the {LECTURE_SOURCE}.\n\n"
        f"{markdown_table(pd.DataFrame(summary))}\n\n"
        f"{markdown_table(pd.DataFrame(detail))}\n"
    )
    return text, matches, fits


def _alpha_beta_section(df: pd.DataFrame, fits: dict) -> tuple[str, Any]:
    try:
        overall = analysis.fit_alpha_beta(df)
    except (ValueError, KeyError) as error:
        return f"## α–β model\n\nNo fit: {error}.\n", None
    by_name = analysis.fit_alpha_beta_per_algorithm(df)
    per_algorithm = {a: by_name[a] for a in _algorithms(df) if a in by_name}
    table = pd.DataFrame(
        [
            {
                "scope": fit.scope,
                "α per round": format_seconds(fit.alpha_s),
                "1/β (GB/s)": f"{fit.beta_gbps:.3g}",
                "R² (linear time)": f"{fit.r2:.3f}",
                "median rel. error": f"{fit.median_rel_error:.1%}",
                "rows": fit.n_rows,
            }
            for fit in [overall, *per_algorithm.values()]
        ]
    )
    caution = ""
    if not overall.r2 >= 0.9:
        caution = (
            f"\nThe machine-wide fit is poor (R² = {overall.r2:.2f}): ranks share CPU cores "
            "here, so a round's cost depends on how many ranks compete for a core and per-byte "
            "cost includes the reduction arithmetic. The per-algorithm fits let each algorithm "
            "carry its own overheads; read the extrapolation below as a rough guide only.\n"
        )
    largest = int(df["message_bytes"].max())
    ordered = {a: fits[a] for a in _algorithms(df) if a in fits}
    model = analysis.extrapolate(ordered, overall, n=1024, message_bytes=largest)
    own = analysis.extrapolate(ordered, per_algorithm, n=1024, message_bytes=largest)
    model["time (per-algorithm fit)"] = own["time_s"].map(format_seconds)
    model["rounds"] = model["rounds"].map(lambda r: f"{r:.4g}")
    for column in ("peak_bytes", "total_bytes"):
        model[column] = model[column].map(format_bytes)
    model["time (machine-wide fit)"] = model.pop("time_s").map(format_seconds)
    model = model.drop(columns=["world_size", "message_bytes", "algbw_gbps", "basis"]).rename(
        columns={"peak_bytes": "peak-rank bytes", "total_bytes": "total bytes"}
    )
    text = (
        "## α–β model and extrapolation to 1024 ranks\n\n"
        "Non-negative least squares (on relative error) of time ≈ α·rounds + β·peak-rank "
        "bytes over every ok cell of the from-scratch algorithms (Hockney's model, as in "
        "Thakur, Rabenseifner & Gropp 2005). Fitted here, not assumed:\n\n"
        f"{markdown_table(table)}\n{caution}\n"
        f"**Model extrapolation, not a measurement:** growth fits above evaluated at N = 1024 "
        f"and M = {format_bytes(largest)}, times from the α–β fits.\n\n"
        f"{markdown_table(model)}\n"
    )
    return text, overall


def _busbw_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """busbw per algorithm and its ratio to torch's. The ratio is the paired one (torch timed
    in windows alternating with the algorithm's, same cell, same buffers) where the run has
    it, else the ratio of two separately measured cells."""
    ok = ok_rows(df)
    index = ["world_size", "message_bytes"]
    wide = ok.pivot_table(index=index, columns="algorithm", values="busbw_gbps")
    paired = pd.DataFrame(index=wide.index)
    if "busbw_vs_torch" in ok.columns:
        paired = ok.pivot_table(index=index, columns="algorithm", values="busbw_vs_torch")
    if "torch" not in wide.columns and paired.empty:
        return pd.DataFrame()
    table = pd.DataFrame(index=wide.index)
    if "torch" in wide.columns:
        table["torch busbw (GB/s)"] = wide["torch"]
    for algorithm in ("ring", "recursive_halving"):
        if algorithm not in wide.columns:
            continue
        table[f"{algorithm} busbw (GB/s)"] = wide[algorithm]
        if algorithm in paired.columns and paired[algorithm].notna().any():
            table[f"{algorithm} / torch"] = paired[algorithm].reindex(wide.index)
        elif "torch" in wide.columns:
            table[f"{algorithm} / torch"] = wide[algorithm] / wide["torch"]
    return table.reset_index()


def _headline_cell(ratios: pd.DataFrame) -> pd.Series | None:
    if ratios.empty or "ring / torch" not in ratios:
        return None
    usable = ratios.dropna(subset=["ring / torch"])
    world, message = HEADLINE_CELL
    preferred = usable[(usable["world_size"] == world) & (usable["message_bytes"] == message)]
    if not preferred.empty:
        return preferred.iloc[0]
    at_world = usable[usable["world_size"] == world]
    candidates = at_world if not at_world.empty else usable
    if candidates.empty:
        return None
    return candidates.sort_values(["message_bytes", "world_size"]).iloc[-1]


def _torch_section(ratios: pd.DataFrame, cell: pd.Series | None) -> str:
    if ratios.empty:
        return "## Speed against torch.distributed\n\nNo torch baseline rows were measured.\n"
    shown = ratios.copy()
    shown["message_bytes"] = shown["message_bytes"].map(format_bytes)
    for column in shown.columns[2:]:
        fmt = format_ratio if column.endswith("torch") else (lambda v: f"{v:.3g}")
        shown[column] = shown[column].map(fmt)
    headline = "No cell has both ring and torch measured."
    if cell is not None:
        headline = (
            f"Headline (measured): ring busbw is **{format_ratio(cell['ring / torch'])}** of "
            f"torch's at N = {int(cell['world_size'])}, M = {format_bytes(cell['message_bytes'])}"
            f" (target ≥ {TORCH_RATIO_TARGET:.2f}×, from the issue)."
        )
    return (
        "## Speed against torch.distributed\n\n"
        "busbw of each from-scratch algorithm divided by `torch.distributed.all_reduce`'s, "
        "measured side by side: within each cell torch's all-reduce is timed on the same "
        "buffers in windows alternating with the algorithm's, so machine drift affects both "
        "alike (the `torch busbw` column is torch's own cell).\n\n"
        f"{headline}\n\n{markdown_table(shown)}\n"
    )


def _correctness_section(df: pd.DataFrame) -> tuple[str, int, list[dict]]:
    wrong = pd.to_numeric(df["wrong"], errors="coerce")
    wrong_total = int(np.nansum(wrong))
    by_algorithm = df.assign(wrong=wrong).groupby("algorithm")["wrong"].sum(min_count=1)
    verdict = "all zero" if wrong_total == 0 else f"**{wrong_total} wrong elements**"
    failures = failures_list(df, ["algorithm", "world_size", "message_bytes"])
    per_algorithm = ", ".join(f"{a}: {int(v) if v == v else '—'}" for a, v in by_algorithm.items())
    text = (
        "## Correctness and failures\n\n"
        f"Wrong elements against the reference, summed over every ok cell: {verdict} "
        f"({per_algorithm}).\n\n{failed_cells_markdown(failures)}"
    )
    return text, wrong_total, failures


def _lines(ax: Any, data: pd.DataFrame, x: str, y: str, palette: dict, legend: bool) -> None:
    """One line per algorithm; marker and dash differ too, so equal counts stay visible."""
    order = [a for a in palette if a in set(data["algorithm"])]
    sns.lineplot(
        data=data, x=x, y=y, hue="algorithm", style="algorithm", hue_order=order,
        style_order=order, palette=palette, markers=True, markersize=8, alpha=0.85, ax=ax,
        legend=legend,
    )  # fmt: skip
    if legend:
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), title="algorithm")


def _plot_busbw_vs_n(ok: pd.DataFrame, palette: dict, path: Path) -> None:
    largest = int(ok["message_bytes"].max())
    rows = ok[ok["message_bytes"] == largest]
    fig, (ax,) = new_figure(7.5)
    _lines(ax, rows, "world_size", "busbw_gbps", palette, legend=True)
    log2_axis(ax, sorted(rows["world_size"].unique()))
    ax.set(xlabel="world size N (ranks)", ylabel="bus bandwidth (GB/s)")
    ax.set_title(f"All-reduce busbw vs world size at M = {format_bytes(largest)} (measured)")
    save_figure(fig, path)


def _plot_traffic_vs_n(traffic: pd.DataFrame, palette: dict, path: Path) -> None:
    fig, axes = new_figure(11.5, cols=2)
    panels = (("peak_per_M", "peak per-rank bytes / M"), ("total_per_M", "total bytes / M"))
    for i, (ax, (column, label)) in enumerate(zip(axes, panels, strict=True)):
        _lines(ax, traffic, "world_size", column, palette, legend=i == 1)
        log2_axis(ax, sorted(traffic["world_size"].unique()))
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set(xlabel="world size N (ranks)", ylabel=f"{label} (log scale)", title=label)
    fig.suptitle("Counted all-reduce traffic vs world size (exact counters, log–log)")
    save_figure(fig, path)


def _plot_time_vs_size(ok: pd.DataFrame, palette: dict, path: Path) -> None:
    sizes = sorted(ok["world_size"].unique())
    fig, axes = new_figure(4.5 * len(sizes) + 2, cols=len(sizes), sharey=True)
    messages = sorted(ok["message_bytes"].unique())
    ticks = messages[:: max(1, -(-len(messages) // 4))]
    for i, (ax, world) in enumerate(zip(axes, sizes, strict=True)):
        rows = ok[ok["world_size"] == world]
        _lines(ax, rows, "message_bytes", "time_s", palette, legend=i == len(sizes) - 1)
        log2_axis(ax, ticks, as_bytes=True)
        ax.set_yscale("log")
        ax.set(xlabel="message size M", ylabel="time per call (s, log scale)", title=f"N = {world}")
    fig.suptitle("All-reduce time vs message size (measured: median over repeats, slowest rank)")
    save_figure(fig, path)


def _figures(
    matches: dict[str, dict[str, bool]], cell: pd.Series | None, overall: Any, wrong_total: int,
    failures: list[dict],
) -> list[dict[str, str]]:  # fmt: skip
    figures = []
    if cell is not None:
        ratio = float(cell["ring / torch"])
        where = f"N={int(cell['world_size'])}, {format_bytes(cell['message_bytes'])}"
        figures.append(figure_row(
            f"ring all-reduce busbw ÷ torch.distributed ({where})", f"≥ {TORCH_RATIO_TARGET:.2f}×",
            "issue target", format_ratio(ratio), f"{ratio - TORCH_RATIO_TARGET:+.2f}×",
        ))  # fmt: skip
    for algorithm, lecture in LECTURE_ORDERS.items():
        columns = list(lecture)
        if algorithm not in matches or set(matches[algorithm]) != set(columns):
            continue
        names = " / ".join(LECTURE_COLUMNS[c] for c in columns)
        missed = [c for c in columns if not matches[algorithm][c]]
        measured = " / ".join(
            lecture[c] if matches[algorithm][c] else f"not {lecture[c]}" for c in columns
        )
        figures.append(figure_row(
            f"{algorithm}: growth of {names}", " / ".join(lecture.values()), "lecture table",
            measured, "match" if not missed else "mismatch: " + ", ".join(missed),
        ))  # fmt: skip
    if overall is not None:
        figures.append(figure_row(
            "α–β fit, all algorithms", "—", "fitted, Hockney α–β model",
            f"α = {format_seconds(overall.alpha_s)}/round, 1/β = {overall.beta_gbps:.3g} GB/s, "
            f"R² = {overall.r2:.2f}", "—",
        ))  # fmt: skip
    figures.append(figure_row("wrong elements", "0", "reference check", str(wrong_total),
                              f"{wrong_total:+d}"))  # fmt: skip
    figures.append(figure_row("failed cells", "0", "grid", str(len(failures)),
                              f"{len(failures):+d}"))  # fmt: skip
    return figures


def _ratio_fields(cell: pd.Series | None) -> dict[str, Any]:
    fields = dict.fromkeys(
        ["ring_vs_torch_busbw_ratio", "ring_vs_torch_world_size", "ring_vs_torch_message_bytes",
         "recursive_halving_vs_torch_busbw_ratio"]
    )  # fmt: skip
    if cell is not None:
        fields["ring_vs_torch_busbw_ratio"] = float(cell["ring / torch"])
        fields["ring_vs_torch_world_size"] = int(cell["world_size"])
        fields["ring_vs_torch_message_bytes"] = int(cell["message_bytes"])
        fields["recursive_halving_vs_torch_busbw_ratio"] = cell.get("recursive_halving / torch")
    return fields


def write_report(df: pd.DataFrame, report_dir: Path) -> dict[str, Any]:
    """Write report.md, busbw_vs_n.png, traffic_vs_n.png, time_vs_size.png and headline.json."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    ok = ok_rows(df)
    palette = _palette(_algorithms(df))
    growth_text, matches, fits = _growth_section(df)
    alpha_text, overall = _alpha_beta_section(df, fits)
    ratios = _busbw_ratios(df)
    cell = _headline_cell(ratios)
    correctness_text, wrong_total, failures = _correctness_section(df)
    plots = []
    if not ok.empty:
        _plot_busbw_vs_n(ok, palette, report_dir / "busbw_vs_n.png")
        plots.append("busbw_vs_n")
        traffic = traffic_per_world_size(df)
        if not traffic.empty:
            _plot_traffic_vs_n(traffic, palette, report_dir / "traffic_vs_n.png")
            plots.append("traffic_vs_n")
        _plot_time_vs_size(ok, palette, report_dir / "time_vs_size.png")
        plots.append("time_vs_size")
    text = "\n".join(
        [
            "# All-reduce scaling: the lecture's aggregation table, measured\n",
            _setup_section(df),
            growth_text,
            alpha_text,
            _torch_section(ratios, cell),
            correctness_text,
            "## Plots\n",
            "".join(f"![{name}]({name}.png)\n\n" for name in plots) or "No ok cells to plot.\n",
        ]
    )
    write_text_atomic(report_dir / "report.md", text)
    headline = {
        "experiment": "allreduce_scaling",
        **_ratio_fields(cell),
        "wrong_total": wrong_total,
        "failed_cells": len(failures),
        "failures": failures,
        "growth_matches_lecture": matches,
        "alpha_s": getattr(overall, "alpha_s", None),
        "beta_gbps": getattr(overall, "beta_gbps", None),
        "alpha_beta_r2": getattr(overall, "r2", None),
        "figures": _figures(matches, cell, overall, wrong_total, failures),
    }
    write_headline(report_dir, headline)
    return to_jsonable(headline)
