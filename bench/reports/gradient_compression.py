"""Report for `gradient_compression`: accuracy against bytes on the wire for every
compression method, on real data, beside uncompressed DP and torch's own comm hooks.

Every figure is read from results.csv: bytes per step are what distbench's communicator
counted (the busiest rank's bytes sent per step, median over steps); accuracies are on the
task's held-out set after the last step; `baseline_accuracy` and `compression_ratio` come
from the `dp` row of the same seed in the same run. Theory appears only as labelled
bounds: QSGD's variance bound (Alistarh et al. 2017, Lemma 3.1) and TernGrad's
(Wen et al. 2017, §3).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator

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

__all__ = ["LABELS", "write_report"]

LABELS = {
    "dp": "DP (fp32 ring all-reduce)",
    "topk": "Top-K + error feedback",
    "topk_noef": "Top-K, no error feedback",
    "randomk": "Random-K + error feedback",
    "dgc": "DGC",
    "onebit": "1-bit SGD",
    "terngrad": "TernGrad",
    "qsgd": "QSGD",
    "powersgd": "PowerSGD",
    "fp16": "fp16 all-reduce",
    "bf16": "bf16 all-reduce",
    "torch_powersgd": "torch powerSGD_hook",
    "torch_fp16": "torch fp16_compress_hook",
}
QSGD_SOURCE = "Alistarh et al. 2017 (QSGD), Lemma 3.1: E‖Q(g) − g‖² ≤ min(n/s², √n/s)·‖g‖²"
TERN_SOURCE = "Wen et al. 2017 (TernGrad) §3: E‖ĝ − g‖² = Σ(s·|g_i| − g_i²) ≤ s·‖g‖₁"
DONE_SOURCE = "issue 6: Top-K 1% + EF within 1 point of DP with ≥ 50× fewer bytes"
KEYS = ["method", "setting"]


def _label(method: str, setting: Any) -> str:
    name = LABELS.get(method, method)
    return f"{name} ({setting})" if isinstance(setting, str) and setting else name


def _order(df: pd.DataFrame) -> pd.DataFrame:
    rank = {m: i for i, m in enumerate(LABELS)}
    return df.assign(_o=df["method"].map(lambda m: rank.get(m, len(rank)))).sort_values(
        ["_o", "setting"]
    ).drop(columns="_o")


def _settings(ok: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, setting): the mean over seeds of every measured column."""
    ok = ok.assign(setting=ok["setting"].fillna("").astype(str))
    numeric = ["final_accuracy", "baseline_accuracy", "final_loss", "final_train_loss",
               "bytes_per_step", "baseline_bytes_per_step", "compression_ratio",
               "step_time_s", "comm_time_s", "simulated_s", "train_time_s"]  # fmt: skip
    present = [c for c in numeric if c in ok]
    grouped = ok.groupby(KEYS, sort=False)
    out = grouped[present].mean()
    out["seeds"] = grouped["seed"].nunique()
    out["accuracy_sd"] = grouped["final_accuracy"].std()
    out["impl"] = grouped["impl"].first()
    out["task"] = grouped["task"].first()
    return _order(out.reset_index())


def _pts(value: float) -> str:
    return "—" if not math.isfinite(value) else f"{round(100 * value, 2) + 0.0:+.2f}"  # no −0.00


def _acc(value: float) -> str:
    return "—" if not math.isfinite(value) else f"{100 * value:.2f}%"


def _setup_section(df: pd.DataFrame, ok: pd.DataFrame) -> str:
    first = ok.iloc[0]
    latency, bandwidth = float(first["latency_ms"]), float(first["bandwidth_mbps"])
    if latency == 0 and not math.isfinite(bandwidth):
        network = "no simulated network (loopback only)"
    else:
        network = (f"a simulated link of {latency:g} ms per round and {bandwidth:g} Mbit/s "
                   "(`impls.comm.SimulatedNetwork`) under distbench's exchanges")  # fmt: skip
    seeds = ", ".join(str(int(s)) for s in sorted(ok["seed"].unique()))
    return (
        "## What was measured, on what\n\n"
        f"Task `{first['task']}` ({int(first['params']):,} parameters), data-parallel on "
        f"{int(first['world_size'])} ranks, {int(first['steps'])} SGD steps (global batch "
        f"{int(first['batch_size'])}, peak lr {float(first['lr']):g}, cosine decay to 0; "
        f"momentum 0.9, inside the compressor for DGC), seeds {seeds}; {network}. "
        f"{run_context(df)}\n\n"
        "**Bytes per step**: the bytes the busiest rank sent in one step, counted by "
        "distbench's communicator (median over steps) — payloads are all-gathered (sparse "
        "and quantized methods) or all-reduced (fp16/bf16, PowerSGD's factors), so this "
        "includes every copy the collective makes. **Compression ratio**: DP's measured "
        "bytes per step over the method's, same seed, this run. **Exchange time**: the "
        "`aggregate` call (compress + collective + decode), slowest rank, median; "
        "**simulated**: the part of it the modelled link added. torch's DDP hooks move "
        "bytes inside torch.distributed, out of sight of these counters, and overlap them "
        "with backward: their bytes and exchange time are not shown (never estimated), and "
        "the simulated link does not apply to them.\n"
    )


def _summary_section(settings: pd.DataFrame) -> str:
    table = pd.DataFrame({
        "method": [_label(m, s) for m, s in zip(settings["method"], settings["setting"],
                                                strict=True)],
        "final accuracy": settings["final_accuracy"].map(_acc),
        "vs DP (points)": (settings["final_accuracy"] - settings["baseline_accuracy"]).map(_pts),
        "bytes / step": settings["bytes_per_step"].map(format_bytes),
        "compression": settings["compression_ratio"].map(format_ratio),
        "step time": settings["step_time_s"].map(format_seconds),
        "exchange": settings["comm_time_s"].map(format_seconds),
        "simulated link": settings["simulated_s"].map(format_seconds),
        "held-out loss": settings["final_loss"].map(lambda v: f"{v:.4f}"),
        "seeds": settings["seeds"],
    })  # fmt: skip
    return (
        "## Every method\n\nMeans over seeds. `vs DP` is the accuracy difference from "
        "uncompressed DP of the same seeds, in percentage points"
        + (f" (one of the 359 held-out images is {100 / 359:.2f} points)"
           if set(settings.get("task", [])) == {"digits"} else "")
        + f".\n\n{markdown_table(table, numparse=False)}\n"
    )


def _curves(ok: pd.DataFrame) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """(method, setting) -> (mean train loss per step, [[step, acc]]) over seeds."""
    out = {}
    for (method, setting), rows in ok.groupby(KEYS, sort=False):
        losses = [json.loads(c) if isinstance(c, str) else c for c in rows["loss_curve"]]
        evals = [json.loads(c) if isinstance(c, str) else c for c in rows["eval_curve"]]
        n = min(len(v) for v in losses)
        loss = np.mean([v[:n] for v in losses], axis=0)
        m = min(len(v) for v in evals)
        acc = np.mean([[e[3] for e in v[:m]] for v in evals], axis=0)
        steps = np.array([e[0] for e in evals[0][:m]])
        out[(method, str(setting))] = (loss, np.stack([steps, acc]))
    return out


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    if len(values) < window or window < 2:
        return values
    kernel = np.ones(window) / window
    return np.convolve(values, kernel, mode="valid")


def _plot_curves(ok: pd.DataFrame, path: Path) -> None:
    curves = _curves(ok.assign(setting=ok["setting"].fillna("").astype(str)))
    fig, (loss_ax, acc_ax) = new_figure(13, 4.8, 1, 2)
    window = max(1, int(ok["steps"].max()) // 30)
    for i, ((method, setting), (loss, evals)) in enumerate(curves.items()):
        style = "--" if method.startswith("torch_") or method == "topk_noef" else "-"
        colour = f"C{i % 10}"
        style = ("-", "-.", ":")[(i // 10) % 3] if style == "-" else style  # > 10 lines: new dash
        smooth = _smooth(loss, window)
        loss_ax.plot(np.arange(len(smooth)) + window, smooth, style, color=colour,
                     label=_label(method, setting), linewidth=1.2)  # fmt: skip
        acc_ax.plot(evals[0], 100 * evals[1], style, color=colour, marker=".", linewidth=1.2)
    loss_ax.set(yscale="log", xlabel="step", ylabel=f"train loss (mean of ranks, {window}-step avg)",
                title="Training loss")  # fmt: skip
    acc_ax.set(xlabel="step", ylabel="held-out accuracy (%)", title="Held-out accuracy")
    low = max(0.0, 100 * float(ok["final_accuracy"].min()) - 5)
    acc_ax.set_ylim(low, 100)
    fig.legend(*loss_ax.get_legend_handles_labels(), loc="upper center",
               bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize="small")  # fmt: skip
    save_figure(fig, path)


def _pareto(points: pd.DataFrame) -> pd.DataFrame:
    """The rows no other row beats on both fewer bytes and higher accuracy."""
    pts = points.sort_values(["bytes_per_step", "final_accuracy"], ascending=[True, False])
    best, keep = -math.inf, []
    for idx, acc in zip(pts.index, pts["final_accuracy"], strict=True):
        if acc > best:
            keep.append(idx)
            best = acc
    return pts.loc[keep]


def _plot_pareto(settings: pd.DataFrame, path: Path) -> pd.DataFrame:
    pts = settings[np.isfinite(settings["bytes_per_step"])]
    frontier = _pareto(pts)
    fig, (ax,) = new_figure(8.5, 5.5)
    for i, row in enumerate(pts.itertuples()):
        # 10 colours × 7 markers: no two of up to 70 settings look alike
        ax.scatter(row.bytes_per_step, 100 * row.final_accuracy, s=55, color=f"C{i % 10}",
                   marker="osD^v<>"[i % 7], zorder=5, label=_label(row.method, row.setting))  # fmt: skip
    ax.step(frontier["bytes_per_step"], 100 * frontier["final_accuracy"], where="post",
            color="grey", alpha=0.6, label="Pareto frontier")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    ax.set(xlabel="bytes on the wire per step (busiest rank, counted)",
           ylabel="final held-out accuracy (%)",
           title="Accuracy against bytes on the wire (up and left is better)")  # fmt: skip
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    save_figure(fig, path)
    return frontier


def _quantizer_section(ok: pd.DataFrame) -> tuple[str, list[dict]]:
    rows = ok[ok["method"].isin(["qsgd", "terngrad"]) & np.isfinite(ok["quant_bias_stat"])]
    if rows.empty:
        return "", []
    rows = _order(rows.assign(setting=rows["setting"].fillna("").astype(str)))
    entries = []
    for row in rows.itertuples():
        entries.append({
            "method": row.method, "setting": row.setting, "seed": int(row.seed),
            "bias_stat": float(row.quant_bias_stat), "variance": float(row.quant_variance),
            "bound": float(row.quant_variance_bound),
            "expected": float(row.quant_variance_expected),
            "numel": int(row.quant_numel), "draws": int(row.quant_draws),
        })  # fmt: skip
    table = pd.DataFrame({
        "method": [_label(e["method"], e["setting"]) for e in entries],
        "seed": [e["seed"] for e in entries],
        "bias statistic S (≈ 1: unbiased)": [f"{e['bias_stat']:.3f}" for e in entries],
        "E‖Q(g) − g‖² measured": [f"{e['variance']:.4g}" for e in entries],
        "paper's bound": [f"{e['bound']:.4g}" for e in entries],
        "measured ÷ bound": [f"{e['variance'] / e['bound']:.3f}" for e in entries],
        "exact expectation": [f"{e['expected']:.4g}" if math.isfinite(e["expected"]) else "—"
                              for e in entries],
    })  # fmt: skip
    text = (
        "## QSGD and TernGrad: unbiased, and within their variance bounds\n\n"
        f"On rank 0, after training, one real gradient g (the first layer's, "
        f"{entries[0]['numel']:,} elements) is quantized {entries[0]['draws']} times "
        "independently. Bias statistic S = draws·‖mean − g‖² / tr(Ĉov): for an unbiased "
        "quantizer the error of the mean is only the sampling noise, so S ≈ 1; a quantizer "
        "biased by even a few percent of its noise gives S ≫ 1 (the unit tests show a "
        "floor-rounding QSGD failing the same kind of test). Variance: the mean of "
        "‖Q(g) − g‖² over the draws, beside the bound of each paper "
        f"({QSGD_SOURCE}; {TERN_SOURCE}).\n\n{markdown_table(table, numparse=False)}\n"
    )
    return text, entries


def _torch_section(settings: pd.DataFrame, ok: pd.DataFrame) -> tuple[str, list[dict]]:
    pairs = [("powersgd", "torch_powersgd"), ("fp16", "torch_fp16")]
    out, lines = [], []
    dp = ok[ok["method"] == "dp"]["final_accuracy"]
    noise = float(dp.std()) if len(dp) > 1 else math.nan
    for ours, theirs in pairs:
        a = settings[settings["method"] == ours]
        b = settings[settings["method"] == theirs]
        for setting in sorted(set(a["setting"]) & set(b["setting"])):
            ra = a[a["setting"] == setting].iloc[0]
            rb = b[b["setting"] == setting].iloc[0]
            diff = float(ra["final_accuracy"] - rb["final_accuracy"])
            out.append({"ours": ours, "torch": theirs, "setting": setting,
                        "accuracy": float(ra["final_accuracy"]),
                        "torch_accuracy": float(rb["final_accuracy"]), "diff": diff,
                        "step_time_s": float(ra["step_time_s"]),
                        "torch_step_time_s": float(rb["step_time_s"])})  # fmt: skip
            lines.append({
                "distbench": _label(ours, setting), "torch": _label(theirs, setting),
                "accuracy (distbench / torch)": f"{_acc(ra['final_accuracy'])} / "
                                                f"{_acc(rb['final_accuracy'])}",
                "difference (points)": _pts(diff),
                "step time (distbench / torch)": f"{format_seconds(ra['step_time_s'])} / "
                                                 f"{format_seconds(rb['step_time_s'])}",
            })  # fmt: skip
    if not out:
        return "", []
    noise_text = (f"The seed-to-seed standard deviation of DP's accuracy in this run is "
                  f"{100 * noise:.2f} points." if math.isfinite(noise) else
                  "Only one seed ran, so the run has no seed-to-seed spread to compare with.")  # fmt: skip
    return (
        "## Beside torch's DDP comm hooks\n\n"
        "Same model, data, optimizer and schedule under torch's `DistributedDataParallel` "
        "with `powerSGD_hook` (error feedback, warm start, `start_powerSGD_iter=2`: torch's "
        "smallest with those on, so its first two steps are uncompressed) and "
        "`fp16_compress_hook`. " + noise_text + " torch's step time overlaps its "
        "all-reduces with backward and runs no simulated link; distbench's includes its "
        f"exchange.\n\n{markdown_table(pd.DataFrame(lines), numparse=False)}\n"
    ), out


def _done_when(settings: pd.DataFrame) -> dict[str, Any]:
    def pick(method: str, setting: str):
        rows = settings[(settings["method"] == method) & (settings["setting"] == setting)]
        return rows.iloc[0] if len(rows) else None

    out: dict[str, Any] = {}
    topk, noef = pick("topk", "density=0.01"), pick("topk_noef", "density=0.01")
    if topk is not None:
        out["topk_1pct"] = {
            "accuracy": float(topk["final_accuracy"]),
            "baseline_accuracy": float(topk["baseline_accuracy"]),
            "points_vs_dp": float(100 * (topk["final_accuracy"] - topk["baseline_accuracy"])),
            "bytes_per_step": float(topk["bytes_per_step"]),
            "compression_ratio": float(topk["compression_ratio"]),
        }
    if noef is not None:
        out["topk_noef_1pct_points_vs_dp"] = float(
            100 * (noef["final_accuracy"] - noef["baseline_accuracy"])
        )
    return out


def _figures(done: dict, quant: list[dict], torch_rows: list[dict], frontier: pd.DataFrame,
             failed: int) -> list[dict]:  # fmt: skip
    figures = []
    top = done.get("topk_1pct")
    if top:
        figures.append(figure_row(
            "Top-K 1% + error feedback: accuracy vs uncompressed DP (points)", "≥ −1",
            DONE_SOURCE, f"{top['points_vs_dp']:+.2f}", f"{top['points_vs_dp'] + 1:+.2f} margin"))  # fmt: skip
        figures.append(figure_row(
            "Top-K 1% + error feedback: DP's bytes per step ÷ Top-K's (counted)", "≥ 50×",
            DONE_SOURCE, format_ratio(top["compression_ratio"]),
            f"{top['compression_ratio'] / 50:.2f}× the target"))  # fmt: skip
    if "topk_noef_1pct_points_vs_dp" in done:
        value = done["topk_noef_1pct_points_vs_dp"]
        figures.append(figure_row(
            "Top-K 1% without error feedback: accuracy vs DP (points)", "—",
            "lecture: residuals carried to future updates", f"{value:+.2f}", "—"))  # fmt: skip
    for e in quant:
        figures.append(figure_row(
            f"{LABELS[e['method']]} {e['setting']}".strip() + f" (seed {e['seed']}): bias "
            "statistic S / variance ÷ bound", "S ≈ 1 / ≤ 1",
            QSGD_SOURCE if e["method"] == "qsgd" else TERN_SOURCE,
            f"{e['bias_stat']:.2f} / {e['variance'] / e['bound']:.3f}", "—"))  # fmt: skip
    for t in torch_rows:
        if t["ours"] == "powersgd":
            figures.append(figure_row(
                f"PowerSGD {t['setting']}: accuracy, distbench − torch powerSGD_hook (points)",
                "0 within noise", "Vogels et al. 2019; torch powerSGD_hook",
                f"{100 * t['diff']:+.2f}", f"{100 * t['diff']:+.2f}"))  # fmt: skip
    if len(frontier):
        names = ", ".join(_label(m, s) for m, s in zip(frontier["method"], frontier["setting"],
                                                       strict=True))
        figures.append(figure_row("Pareto frontier (fewest bytes for the accuracy)", "—",
                                  "this run", names, "—"))  # fmt: skip
    figures.append(figure_row("failed cells", "0", "grid", str(failed), f"{failed:+d}"))
    return figures


def write_report(df: pd.DataFrame, report_dir: Path) -> dict[str, Any]:
    """Write report.md, curves.png, pareto.png and headline.json."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    ok = ok_rows(df)
    failures = failures_list(df, ["method", "setting", "seed"])
    parts = ["# Gradient compression: accuracy against bytes on the wire\n"]
    done: dict[str, Any] = {}
    quant: list[dict] = []
    torch_rows: list[dict] = []
    frontier = pd.DataFrame()
    if ok.empty:
        parts.append("No cell finished; nothing was measured.\n")
    else:
        if "baseline_accuracy" not in ok:
            ok = ok.assign(baseline_accuracy=math.nan, compression_ratio=math.nan)
        settings = _settings(ok)
        done = _done_when(settings)
        parts.append(_setup_section(df, ok))
        parts.append(_summary_section(settings))
        _plot_curves(ok, report_dir / "curves.png")
        frontier = _plot_pareto(settings, report_dir / "pareto.png")
        top = done.get("topk_1pct")
        verdict = ""
        if top:
            within = top["points_vs_dp"] >= -1 and top["compression_ratio"] >= 50
            verdict = (
                f"\n\n**Top-K at 1% with error feedback**: {_acc(top['accuracy'])} against "
                f"DP's {_acc(top['baseline_accuracy'])} ({top['points_vs_dp']:+.2f} points) "
                f"with {format_ratio(top['compression_ratio'])} fewer bytes per step "
                f"({format_bytes(top['bytes_per_step'])} against "
                f"{format_bytes(top['bytes_per_step'] * top['compression_ratio'])}) — "
                + ("within 1 point with ≥ 50× fewer bytes." if within else
                   "**outside** the issue's target (within 1 point, ≥ 50× fewer bytes).")  # fmt: skip
            )
            if "topk_noef_1pct_points_vs_dp" in done:
                verdict += (" Without error feedback the same density gives "
                            f"{done['topk_noef_1pct_points_vs_dp']:+.2f} points.")  # fmt: skip
        parts.append(
            "## Training curves\n\n![loss and accuracy curves](curves.png)\n\n"
            "## Accuracy against bytes on the wire\n\n![pareto](pareto.png)\n\n"
            "Grey: the Pareto frontier — the settings no other beats on both fewer bytes and "
            f"higher accuracy." + verdict + "\n"
        )
        quant_text, quant = _quantizer_section(ok)
        torch_text, torch_rows = _torch_section(settings, ok)
        parts += [quant_text, torch_text]
    parts.append(failed_cells_markdown(failures))
    write_text_atomic(report_dir / "report.md", "\n".join(p for p in parts if p))
    headline = {
        "experiment": "gradient_compression",
        "done_when": done,
        "quantizers": quant,
        "torch_hooks": torch_rows,
        "pareto": [{"method": m, "setting": s} for m, s in
                   zip(frontier.get("method", []), frontier.get("setting", []), strict=True)],
        "failed_cells": len(failures),
        "failures": failures,
        "figures": _figures(done, quant, torch_rows, frontier, len(failures)),
    }
    write_headline(report_dir, headline)
    return to_jsonable(headline)
