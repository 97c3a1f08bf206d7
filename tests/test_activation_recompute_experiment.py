"""The `activation_recompute` experiment's grid, rows and report, without ranks.

A failure means the grid leaves out a (mode, t, SP, s) cell or runs SP on one rank, a row
states the paper's or the implementation's bytes or the FLOPs prediction wrongly (hand-
computed here), the report's headline takes its worst deviation from the wrong rows or
counts an inexact row as exact, or the report breaks on a synthetic frame.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from bench.experiments.activation_recompute.config import ActivationRecomputeConfig
from bench.experiments.activation_recompute.experiment import EXPERIMENT, cells, to_row

CFG = ActivationRecomputeConfig(
    tp=[1, 2], seq_lens=[32, 64], model={"d_model": 64, "n_heads": 4, "dropout": 0.1}
)
META = {
    "status": "ok",
    "error": "",
    "git_sha": "abc1234",
    "torch_version": "2.13.0",
    "backend": "gloo",
    "device": "cpu",
    "host": "h",
    "world_size": 1,
    "timestamp": "2025-01-01T00:00:00",
    "host_cores": 2,
}


def test_grid_has_every_cell_and_sp_only_with_tp():
    keys = [c.key for c in cells(CFG)]
    assert len(keys) == 3 * 2 * 3  # modes x lengths x (t=1, t=2, t=2+SP)
    assert not any(k["sp"] and k["tp"] == 1 for k in keys)
    assert [c.world_size for c in cells(CFG)] == sorted(c.world_size for c in cells(CFG))


def _row(cell, saved_off: int = 0) -> dict:
    per_rank = [
        {
            "saved_bytes": 0,
            "wrong": 0,
            "step_time_s": 2.0,
            "none_step_time_s": 1.6,
            "max_seq_len_in_budget": 128,
        }
    ]
    row = to_row(CFG, cell, per_rank)
    saved = row["model_bytes_per_layer"] + saved_off
    per_rank[0]["saved_bytes"] = saved
    return {**to_row(CFG, cell, per_rank), **META}


def test_rows_hold_hand_computed_predictions():
    by_key = {tuple(c.key.values()): c for c in cells(CFG)}
    sbh = 64 * 2 * 64  # s·b·h at s = 64
    none = _row(by_key[("none", 1, False, 64)])
    assert none["paper_bytes_per_layer"] == sbh * (34 + 5 * 4 * 64 / 64)
    assert none["model_bytes_per_layer"] == sbh * 54 + 8 * 2 * 64  # + LayerNorm statistics
    assert none["overhead_vs_none"] == pytest.approx(0.25)
    sp = _row(by_key[("selective", 2, True, 64)])
    assert sp["paper_bytes_per_layer"] == 34 * sbh / 2
    assert sp["predicted_flops_overhead"] == pytest.approx(64 / (18 * 64 + 3 * 64))
    full = _row(by_key[("full", 2, False, 32)])
    assert full["paper_bytes_per_layer"] == full["saved_bytes_per_layer"] == 2 * 32 * 2 * 64
    assert full["predicted_flops_overhead"] == pytest.approx(1 / 3)


def test_report_on_a_synthetic_frame(tmp_path):
    rows = [_row(c, saved_off=1000 if c.key["recompute"] == "none" else 0) for c in cells(CFG)]
    df = pd.DataFrame(rows)
    headline = EXPERIMENT.report_on(df, tmp_path, None)
    worst = max(abs(r["saved_bytes_per_layer"] / r["paper_bytes_per_layer"] - 1) for r in rows)
    assert headline["saved_vs_paper_max_deviation"] == pytest.approx(worst)
    exact = headline["saved_equal_model_rows"]
    assert exact == {"rows": len(rows), "exact": len(rows) - 6}
    text = (tmp_path / "report.md").read_text()
    assert "Longest sequence within the byte budget" in text and "128" in text
    assert (tmp_path / "saved_bytes.png").stat().st_size > 0
    assert not math.isnan(headline["saved_vs_paper_max_deviation"])
