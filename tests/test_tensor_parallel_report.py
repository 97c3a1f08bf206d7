"""The `tensor_parallel` report on a small synthetic results table.

The numbers below are fixtures shaped like the experiment's results.csv (one row per
method × t), not measurements. A failure here means a generated report would misstate a
run: traffic called equal to Megatron's count when it is not, the speed target judged at
the wrong t or against the wrong bound, a wrong or failed cell that disappears, plots
that are not written, or a report that breaks (or passes its target) on figures that are
all zero or all NaN.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from bench.experiments.tensor_parallel.experiment import EXPERIMENT

METADATA = {
    "git_sha": "abc1234",
    "torch_version": "2.13.0",
    "backend": "gloo",
    "device": "cpu",
    "host": "testhost",
    "host_cores": 2,
    "timestamp": "2025-01-01T00:00:00",
}
MODEL = {"d_model": 16, "n_heads": 4, "n_layers": 2, "seq_len": 8, "vocab_size": 32}


def _row(method: str, t: int, ratio: float = 0.9, **over) -> dict:
    ours = method == "distbench"
    predicted = 0 if t == 1 else 2 * 2 * (t - 1) * 256 // t * 4
    row = {
        "method": method,
        "tp": t,
        "impl": "distbench" if ours else "torch",
        "params": 5000,
        **MODEL,
        "batch_size": 2,
        "steps": 3,
        "loss": 2.9,
        "loss_diff": 1e-7,
        "update_error": 3e-7,
        "wrong": 0,
        "comm_bytes_per_layer_fwd": predicted if ours else math.nan,
        "comm_bytes_per_layer_bwd": predicted if ours else math.nan,
        "comm_rounds_per_layer_fwd": 4 * (t - 1) if ours else math.nan,
        "comm_rounds_per_layer_bwd": 4 * (t - 1) if ours else math.nan,
        "allreduces_per_layer_fwd": 2 if t > 1 else 0,
        "allreduces_per_layer_bwd": (2 if ours else 4) if t > 1 else 0,
        "predicted_comm_bytes_per_layer_fwd": predicted,
        "predicted_comm_bytes_per_layer_bwd": predicted,
        "predicted_allreduces_per_layer": 4 if t > 1 else 0,
        "param_bytes": 20000 // t,
        "activation_bytes": 90000 // t,
        "peak_bytes": 120000 // t,
        "step_time_s": 0.01 * ratio if ours else 0.01,
        "twin_step_time_s": 0.01,
        "step_time_vs_twin": ratio if ours else 1.0,
        "twin": "torch_dtensor",
        "status": "ok",
        "error": "",
        **METADATA,
        "world_size": t,
    }
    row["allreduces_per_layer"] = row["allreduces_per_layer_fwd"] + row["allreduces_per_layer_bwd"]
    row["collectives_per_layer"] = row["allreduces_per_layer"]
    row.update(over)
    return row


def _frame(rows=None) -> pd.DataFrame:
    rows = rows or [_row(m, t) for t in (1, 2, 4) for m in ("distbench", "torch_dtensor")]
    return pd.DataFrame(rows)


def _write(frame: pd.DataFrame, out) -> tuple[dict, str]:
    headline = EXPERIMENT.report_on(frame, out, None)
    return headline, (out / "report.md").read_text()


def test_report_states_the_count_the_ratio_and_writes_every_artefact(tmp_path):
    rows = [
        _row(m, t, ratio=1.2 if t == 4 else 0.9)
        for t in (1, 2, 4)
        for m in ("distbench", "torch_dtensor")
    ]
    headline, text = _write(_frame(rows), tmp_path)
    for name in (
        "report.md",
        "headline.json",
        "comm_per_layer.png",
        "memory_per_rank.png",
        "step_time.png",
    ):
        assert (tmp_path / name).stat().st_size > 0, name
    assert json.loads((tmp_path / "headline.json").read_text()) == headline
    assert "equal the analytic count at every t" in text
    assert "DTensor's backward issued 2 more all-reduce(s)" in text
    assert "0.90×" in text and "within" in text
    assert "At t ∈ {4} there are more ranks than cores" in text
    assert "not its speed-up" in text
    figures = {f["figure"]: f for f in headline["figures"]}
    assert (
        figures["all-reduces per block fwd + bwd, distbench (Megatron layers), t = 4"]["measured"]
        == "2 + 2"
    )
    assert figures["all-reduces per block fwd + bwd, torch DTensor, t = 4"]["gap"] == "+2"
    assert figures["TP bytes per rank per block, t = 4"]["gap"] == "+0.00%"
    (target,) = headline["targets"]  # the issue's ≤ 1.1× at t = 2, on every such cell
    assert target["where"] == {"method": "distbench", "tp": 2} and target["bound"] == 1.1
    assert target["met"] and target["median"] == target["worst"] == 0.9
    assert target["worst_key"] == "method=distbench, tp=2"
    other = figures["TP blocks step ÷ DTensor at t ∈ {1, 4} (paired): median, worst cell"]
    assert other["measured"].startswith("1.05× over 2 cells; worst 1.20× (method=distbench, tp=4")
    assert "cores shared by more ranks" in other["measured"]  # t = 4 > the host's 2 cores
    assert other["theory"].startswith("≤ 1.10×")
    assert all(f["holds"] for f in headline["findings"]), headline["findings"]
    assert headline["wrong_total"] == 0 and headline["step_time_vs_dtensor"]["t=2"] == 0.9


def test_traffic_off_the_count_and_a_slow_step_are_called_out(tmp_path):
    rows = [_row(m, t) for t in (1, 2) for m in ("distbench", "torch_dtensor")]
    rows[2] = _row("distbench", 2, ratio=1.3, comm_bytes_per_layer_fwd=9999)
    headline, text = _write(_frame(rows), tmp_path)
    assert "**distbench's counted traffic differs from the analytic count**" in text
    assert "1.30×" in text and "**outside** the ≤ 1.1× target" in text
    (target,) = headline["targets"]
    assert (
        not target["met"]
        and target["worst"] == 1.3
        and target["missing"] == ["method=distbench, tp=2"]
    )
    broken = [f["claim"] for f in headline["findings"] if not f["holds"]]
    assert broken == ["distbench's bytes per block equal the ring all-reduce count at every t"]


def test_wrong_and_failed_cells_are_counted(tmp_path):
    rows = [_row(m, t) for t in (1, 2) for m in ("distbench", "torch_dtensor")]
    rows[1] = _row("torch_dtensor", 1, wrong=1, update_error=2e-3)
    rows.append(_row("distbench", 4, status="failed", error="RankFailure: timeout"))
    headline, text = _write(_frame(rows), tmp_path)
    assert headline["wrong_total"] == 1 and headline["failed_cells"] == 1
    assert "**1 wrong**" in text and "2.0e-03" in text
    assert "RankFailure: timeout" in text


def test_a_run_with_no_finished_cell_says_so(tmp_path):
    rows = [{"method": "distbench", "tp": 2, "status": "failed", "error": "boom", **METADATA}]
    headline, text = _write(_frame(rows), tmp_path)
    assert "1 cells, 0 ran" in text and "boom" in text
    assert headline["failed_cells"] == 1
    assert headline["targets"][0]["status"].startswith("not measured")


def test_a_single_degree_run_has_no_speed_verdict(tmp_path):
    rows = [_row(m, 1, step_time_vs_twin=math.nan) for m in ("distbench", "torch_dtensor")]
    headline, text = _write(_frame(rows), tmp_path)
    assert "no paired distbench cell at t = 2" in text
    assert not headline["targets"][0]["met"]


@pytest.mark.parametrize("fill", [0.0, np.nan], ids=["zero", "nan"])
def test_degenerate_figures_meet_no_target_and_break_the_claims(tmp_path, fill):
    frame = _frame()
    measured = [
        c
        for c in frame.columns
        if c not in (*EXPERIMENT.key_columns, "host_cores", "world_size")
        and pd.api.types.is_numeric_dtype(frame[c])
    ]
    frame[measured] = fill
    headline, text = _write(frame, tmp_path)
    assert not headline["targets"][0]["met"]
    assert "differs from the analytic count" in text
    assert not all(f["holds"] for f in headline["findings"])
