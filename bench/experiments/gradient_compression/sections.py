"""The `gradient_compression` report's per-method helpers and its two comparison sections:
the quantizers against their papers' bounds, and distbench beside torch's comm hooks."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from bench.report import Context, format_percent, format_seconds, markdown_table, prose

__all__ = ["LABELS", "count", "label", "quantizers", "settings_means", "torch_hooks"]

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
SOURCES = {"qsgd": QSGD_SOURCE, "terngrad": TERN_SOURCE}
KEYS = ["method", "setting"]
ACCURACY = ("final_accuracy", "baseline_accuracy", "final_loss")
COSTS = ("bytes_per_step", "compression_ratio", "step_time_s", "comm_time_s", "simulated_s")
MEANS = (*ACCURACY, *COSTS)


def label(method: str, setting: Any) -> str:
    name = LABELS.get(method, method)
    return f"{name} ({setting})" if isinstance(setting, str) and setting else name


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    rank = {m: i for i, m in enumerate(LABELS)}
    order = df["method"].map(lambda m: rank.get(m, len(rank)))
    return df.assign(_o=order).sort_values(["_o", "setting"]).drop(columns="_o")


def with_setting_text(df: pd.DataFrame) -> pd.DataFrame:
    """The `setting` column as text ("" for methods without one, NaN after a CSV read)."""
    return df.assign(setting=df["setting"].fillna("").astype(str))


def settings_means(ok: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, setting): the mean over seeds of each column the report shows."""
    ok = with_setting_text(ok)
    present = [c for c in MEANS if c in ok]
    grouped = ok.groupby(KEYS, sort=False)
    out = grouped[present].mean()
    out["seeds"] = grouped["seed"].nunique()
    out["task"] = grouped["task"].first()
    return _ordered(out.reset_index())


def _quantizer_entries(ok: pd.DataFrame) -> list[dict[str, Any]]:
    if "quant_bias_stat" not in ok.columns:
        return []
    stat = pd.to_numeric(ok["quant_bias_stat"], errors="coerce")
    rows = ok[ok["method"].isin(SOURCES) & stat.notna()]
    return [
        {
            "method": row.method,
            "setting": row.setting,
            "seed": int(row.seed),
            "bias_stat": float(row.quant_bias_stat),
            "variance": float(row.quant_variance),
            "bound": float(row.quant_variance_bound),
            "expected": float(row.quant_variance_expected),
            "numel": row.quant_numel,
            "draws": row.quant_draws,
        }
        for row in _ordered(with_setting_text(rows)).itertuples()
    ]


def _ratio(variance: float, bound: float) -> float:
    return variance / bound if bound > 0 else math.nan


def count(value: Any) -> str:
    number = pd.to_numeric(value, errors="coerce")
    return "—" if pd.isna(number) else f"{int(number):,}"


def quantizers(ctx: Context) -> str | None:
    """QSGD and TernGrad: unbiased, and within their variance bounds

    On rank 0, after training, one real gradient g (the first layer's) is quantized
    `draws` times independently. Bias statistic S = draws·‖mean − g‖² / tr(Ĉov): for an
    unbiased quantizer the error of the mean is only the sampling noise, so S ≈ 1; a
    quantizer biased by even a few percent of its noise gives S ≫ 1 (the unit tests show
    a floor-rounding QSGD failing the same kind of test). Variance: the mean of
    ‖Q(g) − g‖² over the draws, beside the bound of each paper."""
    entries = _quantizer_entries(ctx.ok)
    ctx.headline["quantizers"] = entries
    if not entries:
        return None
    for e in entries:
        name = f"{LABELS[e['method']]} {e['setting']}".strip() + f" (seed {e['seed']})"
        ratio = _ratio(e["variance"], e["bound"])
        measured = f"{e['bias_stat']:.2f} / {ratio:.3f}"
        figure = f"{name}: bias statistic S / variance ÷ bound"
        ctx.figure(figure, theory="S ≈ 1 / ≤ 1", source=SOURCES[e["method"]], measured=measured)
        ctx.finding(
            f"{name} is unbiased (0.5 < S < 2) and within its paper's variance bound",
            0.5 < e["bias_stat"] < 2 and ratio <= 1,
            f"S = {e['bias_stat']:.3f}, variance ÷ bound = {ratio:.3f}",
        )
    table = pd.DataFrame(
        {
            "method": [label(e["method"], e["setting"]) for e in entries],
            "seed": [e["seed"] for e in entries],
            "bias statistic S (≈ 1: unbiased)": [f"{e['bias_stat']:.3f}" for e in entries],
            "E‖Q(g) − g‖² measured": [f"{e['variance']:.4g}" for e in entries],
            "paper's bound": [f"{e['bound']:.4g}" for e in entries],
            "measured ÷ bound": [f"{_ratio(e['variance'], e['bound']):.3f}" for e in entries],
            "exact expectation": [
                f"{e['expected']:.4g}" if math.isfinite(e["expected"]) else "—" for e in entries
            ],
        }
    )
    numel, draws = count(entries[0]["numel"]), count(entries[0]["draws"])
    text = prose(__package__, "quantizer_draws", numel=numel, draws=draws, **SOURCES)
    return f"{text}\n\n{markdown_table(table, numparse=False)}"


def _hook_pairs(means: pd.DataFrame) -> list[tuple[pd.Series, pd.Series]]:
    """(distbench's, torch's) mean rows of each hook with a counterpart in the run."""
    out = []
    for ours, theirs in (("powersgd", "torch_powersgd"), ("fp16", "torch_fp16")):
        a, b = means[means["method"] == ours], means[means["method"] == theirs]
        for setting in sorted(set(a["setting"]) & set(b["setting"])):
            out.append((a[a["setting"] == setting].iloc[0], b[b["setting"] == setting].iloc[0]))
    return out


def torch_hooks(ctx: Context) -> str | None:
    """Beside torch's DDP comm hooks

    Same model, data, optimizer and schedule under torch's `DistributedDataParallel` with
    `powerSGD_hook` (error feedback, warm start, `start_powerSGD_iter=2`: torch's smallest
    with those on, so its first two steps are uncompressed) and `fp16_compress_hook`.
    torch's step time overlaps its all-reduces with backward and runs no simulated link;
    distbench's includes its exchange."""
    pairs = _hook_pairs(settings_means(ctx.ok)) if not ctx.ok.empty else []
    rows, lines = [], []
    for ra, rb in pairs:
        diff = float(ra["final_accuracy"] - rb["final_accuracy"])
        rows.append(
            {
                "ours": ra["method"],
                "torch": rb["method"],
                "setting": ra["setting"],
                "accuracy": float(ra["final_accuracy"]),
                "torch_accuracy": float(rb["final_accuracy"]),
                "diff": diff,
                "step_time_s": float(ra["step_time_s"]),
                "torch_step_time_s": float(rb["step_time_s"]),
            }
        )
        lines.append(
            {
                "distbench": label(ra["method"], ra["setting"]),
                "torch": label(rb["method"], rb["setting"]),
                "accuracy (distbench / torch)": f"{format_percent(ra['final_accuracy'], 2)} / "
                f"{format_percent(rb['final_accuracy'], 2)}",
                "difference (points)": "—" if not math.isfinite(diff) else f"{100 * diff:+.2f}",
                "step time (distbench / torch)": f"{format_seconds(ra['step_time_s'])} / "
                f"{format_seconds(rb['step_time_s'])}",
            }
        )
        if ra["method"] == "powersgd":
            ctx.figure(
                f"PowerSGD {ra['setting']}: accuracy, distbench − torch powerSGD_hook (points)",
                theory="0 within noise",
                source="Vogels et al. 2019; torch powerSGD_hook",
                measured=f"{100 * diff:+.2f}",
            )
    ctx.headline["torch_hooks"] = rows
    if not rows:
        return None
    dp = ctx.ok[ctx.ok["method"] == "dp"]["final_accuracy"]
    noise = float(np.std(dp, ddof=1)) if len(dp) > 1 else math.nan
    points = f"{100 * noise:.2f}" if math.isfinite(noise) else ""
    text = prose(__package__, "seed_noise", points=points)
    return f"{text}\n\n{markdown_table(pd.DataFrame(lines), numparse=False)}"
