"""The one `Prediction → row` function: how every experiment turns the simulator's
`impls.simulator.plan.Prediction` into result-row columns, so a plan's prediction reads
the same wherever it is reported (at_scale, auto_parallel, planner_validation)."""

from __future__ import annotations

from typing import Any

__all__ = ["STEP_PARTS", "prediction_row"]

STEP_PARTS = {
    "compute": "compute_s",
    "bubble": "bubble_s",
    "tp": "exposed_tp_s",
    "pp": "exposed_pp_s",
    "dp": "exposed_dp_s",
    "optimizer": "optimizer_s",
}
"""The parts a step time adds up from: short name → `Prediction` field."""


def prediction_row(
    p: Any, *, parts: str = "{field}", optimizer_s: float | None = None, summary: bool = True
) -> dict[str, Any]:
    """One prediction as result-row columns, the one place experiments turn a `Prediction`
    into a row: whether it fits, `predicted_step_time_s`, (with `summary`) its rates and
    peak memory, and the step's parts named by `parts`, a format string over `part` and
    `field` of `STEP_PARTS` (`"{field}"`: `exposed_tp_s`; `"predicted_{part}_s"`:
    `predicted_tp_s`). `optimizer_s` replaces the simulator's optimizer time, the step
    time moving with it."""
    optimizer, step = p.optimizer_s, p.step_time_s
    if optimizer_s is not None:
        optimizer, step = optimizer_s, p.step_time_s - p.optimizer_s + optimizer_s
    row: dict[str, Any] = {"fits": bool(p.fits)} if summary else {}
    row["predicted_step_time_s"] = step
    if summary:
        row.update(
            {
                "predicted_tokens_per_s": p.tokens_per_s,
                "predicted_tflops_per_gpu": p.tflops_per_gpu,
                "predicted_mfu": p.mfu,
                "predicted_hfu": p.hfu,
                "predicted_peak_memory_gb": p.peak_memory_bytes / 1e9,
            }
        )
    values = {
        "compute": p.compute_s,
        "bubble": p.bubble_s,
        "tp": p.exposed_tp_s,
        "pp": p.exposed_pp_s,
        "dp": p.exposed_dp_s,
        "optimizer": optimizer,
    }
    for part, name in STEP_PARTS.items():
        row[parts.format(part=part, field=name)] = values[part]
    return row
