"""The `zero_memory` report: measured per-rank memory and traffic of DP and ZeRO-1/2/3.

The ZeRO paper (Rajbhandari et al. 2019) predicts each rank's model states — weights,
gradients, optimizer state — per stage (§5, drawn as stacked bars in its Figure 1) and the
traffic per step (§7: plain DP, ZeRO-1 and ZeRO-2 move 2Ψ, ZeRO-3 3Ψ). Sections: the
measured model states beside the cost model, the counted traffic in units of Ψ, step time
against torch's DDP, ZeroRedundancyOptimizer and FSDP2 on the same model and ranks, and
each cell's update error. The targets (`TARGETS`) are judged on every cell they apply to;
the skeleton (`bench.report.skeleton`) writes the setup, targets, correctness and failed
cells. Measured numbers come from the rows; predictions from the rows' cost-model columns.
"""

from __future__ import annotations

import math
from functools import partial

import pandas as pd

from bench.experiments.zero_memory.methods import TOLERANCE, ZERO_METHODS
from bench.experiments.zero_memory.plots import (
    METHODS,
    PARTS,
    cell_columns,
    comm_figure,
    memory_figure,
)
from bench.experiments.zero_memory.plots import methods_in as _methods
from bench.experiments.zero_memory.speed import SPEED_TARGETS, numeric, prepare_ratios, step_time
from bench.report import (
    Context,
    Report,
    Target,
    format_bytes,
    format_percent,
    markdown_table,
    prose,
)

__all__ = ["COMM_THEORY", "REPORT", "TARGETS"]

_prose = partial(prose, __package__)  # this experiment's prose.md.j2 macros

COMM_THEORY = {0: 2, 1: 2, 2: 2, 3: 3}  # Ψ per rank per step as N → ∞, ring collectives
COMM_SOURCE = "ZeRO paper (Rajbhandari et al. 2019), §7, ring collectives"
MODEL_STATE_BOUND = 0.05


def _pct(value: float | None) -> str:
    return format_percent(value, digits=2)


def _psi(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.3f}Ψ"


MODEL_STATES = Target(
    figure="model-state bytes per rank, |measured ÷ cost model − 1| (every stage, N, precision)",
    column="model_state_abs_error",
    op="<=",
    bound=MODEL_STATE_BOUND,
    source="issue #4; cost model = ZeRO paper §5",
    where={"method": list(ZERO_METHODS)},
    fmt=_pct,
)
TARGETS = (MODEL_STATES, *SPEED_TARGETS)


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """The columns the targets read: |model-state error| (from the bytes, so a row with
    nothing measured has none) and the step-time ratios (`speed.prepare_ratios`)."""
    predicted = numeric(df, "predicted_model_state_bytes")
    error = numeric(df, "model_state_bytes") / predicted.where(predicted > 0) - 1
    df["model_state_abs_error"] = error.abs()
    return prepare_ratios(df)


def _ours(ok: pd.DataFrame) -> pd.DataFrame:
    return ok[ok["impl"] == "distbench"] if "impl" in ok.columns else ok.iloc[0:0]


def model(ctx: Context) -> str | None:
    """Model and methods

    Per-rank memory is measured: on CPU an exact accounting of the tensors each rank holds
    (the ZeRO stages' ledger; for torch's methods the tensors held between steps), on GPU
    the allocator's peak. The predictions beside it are the cost model
    `impls.costmodel.memory` for the same Ψ, stage, N and precision; traffic is counted by
    distbench's communicator, exactly. torch's rows hold what can be observed from outside
    (NaN elsewhere)."""
    if ctx.ok.empty:
        return None
    params = sorted(int(p) for p in numeric(ctx.ok, "params").dropna().unique())
    psi = ", ".join(f"{p:,}" for p in params) or "unknown"
    methods = ", ".join(METHODS.get(m, m) for m in _methods(ctx.ok))
    return _prose("model", methods=methods, psi=psi)


def memory(ctx: Context) -> str | None:
    """Per-rank memory: measured vs the cost model

    error = measured / predicted − 1 of the model states (weights + gradients + optimizer).
    Gathered peak is ZeRO-3's transient all-gathered weights; peak is the most the rank held
    at once in the step (model states + transients + saved activations)."""
    ok = ctx.ok
    measured = [*PARTS, "model_state_bytes", "gathered_peak_bytes", "peak_bytes"]
    if ok.empty or not set(measured) <= set(ok.columns):
        return None
    # A row whose memory could not be observed would be a line of dashes: left out.
    rows = ok[ok[measured].notna().any(axis=1)].sort_values(["precision", "world_size", "stage"])
    full = rows.dropna(subset=list(PARTS))
    shown = ""
    if len(full):
        shown = ctx.plot(memory_figure(full), "memory_per_rank", "model states per rank") + "\n\n"
    table = pd.DataFrame(
        {
            **cell_columns(rows),
            **{title: rows[part].map(format_bytes) for part, title in PARTS.items()},
            "model states": rows["model_state_bytes"].map(format_bytes),
            "predicted": rows["predicted_model_state_bytes"].map(format_bytes),
            "error": (rows["model_state_bytes"] / rows["predicted_model_state_bytes"] - 1).map(
                _pct
            ),
            "gathered peak": rows["gathered_peak_bytes"].map(format_bytes),
            "activations peak": rows["activation_peak_bytes"].map(format_bytes),
            "peak": rows["peak_bytes"].map(format_bytes),
        }
    )
    ours = _ours(rows)
    by_method = ours["model_state_abs_error"].groupby(ours["method"]).max().dropna()
    worst = float(by_method.max()) if len(by_method) else None
    ctx.headline["model_state_error_max"] = worst
    ctx.headline["model_state_error_by_method"] = {m: float(e) for m, e in by_method.items()}
    verdict = _prose(
        "memory_verdict",
        worst=None if worst is None else _pct(worst),
        inside=worst is not None and worst <= MODEL_STATE_BOUND,
        bound=f"{MODEL_STATE_BOUND:.0%}",
        per_method=", ".join(f"{METHODS.get(m, m)} {_pct(e)}" for m, e in by_method.items()),
    )
    _torch_finding(ctx, rows)
    return f"{shown}{verdict}\n\n{markdown_table(table)}"


def _torch_finding(ctx: Context, rows: pd.DataFrame) -> None:
    """Whether torch's sharded methods hold what the same cost model predicts."""
    torch = rows[rows["method"].isin(["torch_zero_redundancy", "torch_fsdp2"])]
    errors = torch.dropna(subset=["model_state_abs_error"])
    if errors.empty:
        return
    off = errors[errors["model_state_abs_error"] > MODEL_STATE_BOUND]
    ctx.finding(
        _prose("torch_finding", bound=f"{MODEL_STATE_BOUND:.0%}"),
        off.empty,
        ", ".join(f"{ctx.key(r)}: {_pct(r['model_state_abs_error'])}" for _, r in off.iterrows()),
    )


def _comm_rows(ok: pd.DataFrame) -> pd.DataFrame:
    rows = _ours(ok).dropna(subset=["comm_psi_multiple", "stage"])
    rows = rows[rows["stage"].isin(list(COMM_THEORY))].sort_values(["world_size", "stage"])
    limit = rows["stage"].astype(int).map(COMM_THEORY)
    return rows.assign(theory_multiple=limit * (rows["world_size"] - 1) / rows["world_size"])


def traffic(ctx: Context) -> str | None:
    """Communication per rank per step

    Theory (ZeRO paper §7): DP all-reduces the gradients, ZeRO-1 and ZeRO-2 reduce-scatter
    them and all-gather the updated weights — 2Ψ either way; ZeRO-3 all-gathers each
    unit's weights for its forward and again for its backward and reduce-scatters its
    gradients — 3Ψ. A ring collective sends (N−1)/N of its buffer per rank, so the counters
    should read 2Ψ·(N−1)/N and 3Ψ·(N−1)/N (plus padding to multiples of N). Counted
    multiple = bytes sent per rank per step / (Ψ · bytes per element), from the
    experiment's counters."""
    if ctx.ok.empty or "comm_psi_multiple" not in ctx.ok.columns:
        return None
    rows = _comm_rows(ctx.ok)
    if rows.empty:
        return "No distbench row was counted."
    table = pd.DataFrame(
        {
            **cell_columns(rows),
            "sent (counted)": rows["comm_bytes_per_step"].map(format_bytes),
            "predicted": rows["predicted_comm_bytes_per_step"].map(format_bytes),
            "counted multiple": rows["comm_psi_multiple"].map(_psi),
            "theory": [
                f"{COMM_THEORY[int(s)]}Ψ·(N−1)/N = {_psi(t)}"
                for s, t in zip(rows["stage"], rows["theory_multiple"], strict=True)
            ],
        }
    )
    ctx.headline["comm_psi_multiple"] = _at_largest(ctx, rows)
    zero = rows[rows["method"].isin(list(ZERO_METHODS))]
    off = zero[zero["comm_bytes_per_step"] != zero["predicted_comm_bytes_per_step"]]
    ctx.finding(
        _prose("traffic_finding"),
        off.empty and not zero.empty,
        ", ".join(ctx.key(r) for _, r in off.iterrows())
        if len(zero)
        else "no ZeRO row was counted",
    )
    figure = ctx.plot(comm_figure(rows), "comm_per_rank", "traffic per rank")
    return f"{figure}\n\n{markdown_table(table)}"


def _at_largest(ctx: Context, rows: pd.DataFrame) -> dict[str, dict]:
    """Each method's counted multiple at its largest N, beside the theory (index rows)."""
    at_largest = {}
    for method, group in rows.groupby("method", sort=False):
        row = group.loc[group["world_size"].idxmax()]
        n, stage = int(row["world_size"]), int(row["stage"])
        entry = {
            "world_size": n,
            "measured": float(row["comm_psi_multiple"]),
            "theory": float(row["theory_multiple"]),
            "theory_limit": COMM_THEORY[stage],
            # ×N/(N−1) undoes the ring's (N−1)/N: comparable with the paper's 2Ψ / 3Ψ.
            "normalised": float(row["comm_psi_multiple"]) * n / (n - 1) if n > 1 else None,
        }
        at_largest[str(method)] = entry
        ctx.figure(
            _prose("traffic_figure", method=METHODS.get(method, method), n=n),
            theory=f"{entry['theory_limit']}Ψ (×(N−1)/N = {_psi(entry['theory'])})",
            source=COMM_SOURCE,
            measured=_psi(entry["measured"]),
            gap=_psi(entry["measured"] - entry["theory"]),
        )
    return at_largest


def update_error(ctx: Context) -> str | None:
    """Update error per cell

    Each cell's parameters after its training steps against the single-process reference:
    the largest |θ − θ_ref| and the update error ‖θ − θ_ref‖ / ‖θ_ref − θ₀‖ beside the
    tolerance of its precision."""
    ok = ctx.ok
    if ok.empty or "update_error" not in ok.columns:
        return None
    rows = ok.sort_values(["precision", "world_size", "method"])
    number = lambda v: "—" if not math.isfinite(v) else f"{v:.3g}"  # noqa: E731
    table = pd.DataFrame(
        {
            **cell_columns(rows),
            "loss": numeric(rows, "loss").map(number),
            "max param diff": numeric(rows, "max_param_diff").map(number),
            "update error": numeric(rows, "update_error").map(number),
            "tolerance": rows["precision"].map(lambda p: f"{TOLERANCE.get(p, math.nan):g}"),
            "wrong": numeric(rows, "wrong").map(
                lambda v: "—" if not math.isfinite(v) else str(int(v))
            ),
        }
    )
    return markdown_table(table, numparse=False)


REPORT = Report(
    title="ZeRO memory: measured model states, traffic and speed per stage",
    intro=_prose("intro"),
    sections=(model, memory, traffic, step_time, update_error),
    targets=TARGETS,
    prepare=prepare,
    correctness=_prose(
        "correctness", tolerances=", ".join(f"{p} {t:g}" for p, t in TOLERANCE.items())
    ),
)
