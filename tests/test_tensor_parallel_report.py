"""The `tensor_parallel` report writer on a small synthetic results table.

The numbers below are fixtures shaped like the experiment's results.csv (one row per
method × t), not measurements. A failure here means a generated report would misstate a
run: traffic called equal to Megatron's count when it is not, the speed verdict taken at
the wrong t or against the wrong target, a wrong or failed cell that disappears, or plots
that are not written.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from bench.reports import tensor_parallel

METADATA = {
    "git_sha": "abc1234", "torch_version": "2.13.0", "backend": "gloo", "device": "cpu",
    "host": "testhost", "host_cores": 2, "timestamp": "2025-01-01T00:00:00",
}  # fmt: skip
MODEL = {"d_model": 16, "n_heads": 4, "n_layers": 2, "seq_len": 8, "vocab_size": 32}


def _row(method: str, t: int, ratio: float = 0.9, **over) -> dict:
    ours = method == "distbench"
    predicted = 0 if t == 1 else 2 * 2 * (t - 1) * 256 // t * 4
    row = {
        "method": method, "tp": t, "impl": "distbench" if ours else "torch", "params": 5000,
        **MODEL, "batch_size": 2, "steps": 3, "loss": 2.9, "loss_diff": 1e-7,
        "update_error": 3e-7, "wrong": 0,
        "comm_bytes_per_layer_fwd": predicted if ours else math.nan,
        "comm_bytes_per_layer_bwd": predicted if ours else math.nan,
        "comm_rounds_per_layer_fwd": 4 * (t - 1) if ours else math.nan,
        "comm_rounds_per_layer_bwd": 4 * (t - 1) if ours else math.nan,
        "allreduces_per_layer_fwd": 2 if t > 1 else 0,
        "allreduces_per_layer_bwd": (2 if ours else 4) if t > 1 else 0,
        "predicted_comm_bytes_per_layer_fwd": predicted,
        "predicted_comm_bytes_per_layer_bwd": predicted,
        "predicted_allreduces_per_layer": 4 if t > 1 else 0,
        "param_bytes": 20000 // t, "activation_bytes": 90000 // t, "peak_bytes": 120000 // t,
        "step_time_s": 0.01 * ratio if ours else 0.01, "twin_step_time_s": 0.01,
        "step_time_vs_twin": ratio if ours else 1.0, "twin": "torch_dtensor",
        "status": "ok", "error": "", **METADATA,
    }  # fmt: skip
    row["allreduces_per_layer"] = row["allreduces_per_layer_fwd"] + row["allreduces_per_layer_bwd"]
    row["collectives_per_layer"] = row["allreduces_per_layer"]
    row.update(over)
    return row


def _frame(rows=None) -> pd.DataFrame:
    rows = rows or [_row(m, t) for t in (1, 2, 4) for m in ("distbench", "torch_dtensor")]
    return pd.DataFrame(rows)


def test_report_states_the_count_the_ratio_and_writes_every_artefact(tmp_path):
    headline = tensor_parallel.write_report(_frame(), tmp_path)
    for name in ("report.md", "headline.json", "comm_per_layer.png", "memory_per_rank.png",
                 "step_time.png"):  # fmt: skip
        assert (tmp_path / name).stat().st_size > 0, name
    text = (tmp_path / "report.md").read_text()
    assert "equal the analytic count at every t" in text
    assert "DTensor's backward issued 2 more all-reduce(s)" in text
    assert "0.90×" in text and "within" in text
    assert "At t ∈ {4} there are more ranks than cores" in text
    assert "not its speed-up" in text
    figures = {
        f["figure"]: f for f in json.loads((tmp_path / "headline.json").read_text())["figures"]
    }
    assert (
        figures["all-reduces per block fwd + bwd, distbench (Megatron layers), t = 4"]["measured"]
        == "2 + 2"
    )
    assert figures["all-reduces per block fwd + bwd, torch DTensor, t = 4"]["gap"] == "+2"
    assert figures["TP bytes per rank per block, t = 4"]["gap"] == "+0.00%"
    assert figures["TP blocks step vs DTensor, t = 2"]["measured"] == "0.90×"
    assert headline["wrong_total"] == 0 and headline["step_time_vs_dtensor"]["t=2"] == 0.9


def test_traffic_off_the_count_and_a_slow_step_are_called_out(tmp_path):
    rows = [_row(m, t) for t in (1, 2) for m in ("distbench", "torch_dtensor")]
    rows[2] = _row("distbench", 2, ratio=1.3, comm_bytes_per_layer_fwd=9999)
    tensor_parallel.write_report(_frame(rows), tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "**distbench's counted traffic differs from the analytic count**" in text
    assert "1.30×" in text and "**outside** the ≤ 1.1× target" in text


def test_wrong_and_failed_cells_are_counted(tmp_path):
    rows = [_row(m, t) for t in (1, 2) for m in ("distbench", "torch_dtensor")]
    rows[1] = _row("torch_dtensor", 1, wrong=1, update_error=2e-3)
    rows.append(_row("distbench", 4, status="failed", error="RankFailure: timeout"))
    headline = tensor_parallel.write_report(_frame(rows), tmp_path)
    assert headline["wrong_total"] == 1 and headline["failed_cells"] == 1
    assert "Wrong cells: **1**" in (tmp_path / "report.md").read_text()
    assert "RankFailure: timeout" in (tmp_path / "report.md").read_text()


def test_a_run_with_no_finished_cell_says_so(tmp_path):
    rows = [_row("distbench", 2, status="failed", error="boom")]
    headline = tensor_parallel.write_report(_frame(rows), tmp_path)
    assert "nothing was measured" in (tmp_path / "report.md").read_text()
    assert headline["failed_cells"] == 1


def test_a_single_degree_run_has_no_speed_verdict(tmp_path):
    rows = [_row(m, 1, step_time_vs_twin=math.nan) for m in ("distbench", "torch_dtensor")]
    tensor_parallel.write_report(_frame(rows), tmp_path)
    assert "no paired distbench cell at t = 2" in (tmp_path / "report.md").read_text()
