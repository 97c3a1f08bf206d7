"""The `sequence_parallel` report on small synthetic results tables.

The numbers below are fixtures shaped like the experiment's results.csv (one row per
method × P × s), not measurements. A failure here means a generated report would misstate
a run: the Ulysses ÷ Megatron-SP ratio taken at the wrong P or from the formula instead of
the counters, a row whose counters leave the formula counted as exact, the activation
model's worst error or the longest sequence taken from the wrong row (or put among the
measured figures, when it is a model's output), wrong tensors or a failed cell that
disappear, plots that are not written, or a report that breaks (or holds its claims) on
figures that are all zero or all NaN.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from bench.experiments.sequence_parallel.experiment import EXPERIMENT
from bench.report.index import write_index

METADATA = {
    "git_sha": "abc1234",
    "torch_version": "2.13.0",
    "backend": "gloo",
    "device": "cpu",
    "host": "testhost",
    "host_cores": 2,
    "timestamp": "2025-01-01T00:00:00",
}
B, H, A, E = 2, 32, 4, 4  # batch, width, heads, bytes per element
LONGEST = {"megatron_sp": 1000, "ulysses": 2000, "ring_attention": 3000}


def _per_link(method: str, sp: int, seq_len: int) -> int:
    """The formulas as `analytic.layer_traffic` writes them (fixture arithmetic)."""
    chunk = B * -(-seq_len // sp) * H * E
    if sp == 1:
        return 0
    return {
        "megatron_sp": 8 * (sp - 1) * chunk,
        "ulysses": 8 * (sp - 1) * chunk // sp,
        "ring_attention": (3 * sp - 2) * 2 * chunk,
    }[method]


def _row(
    method: str,
    sp: int,
    seq_len: int,
    *,
    comm_off: float = 1.0,
    activation_off: float = 1.0,
    wrong: int = 0,
) -> dict:
    predicted = _per_link(method, sp, seq_len)
    counted = int(predicted * comm_off)
    model = 17 * B * -(-seq_len // sp) * H * E
    paper = 34 * seq_len * B * H // sp
    return {
        "method": method,
        "sp": sp,
        "seq_len": seq_len,
        "world_size": sp,
        "batch_size": B,
        "d_model": H,
        "n_heads": A,
        "d_ff": 4 * H,
        "local_seq_len": -(-seq_len // sp),
        "padded_positions": -(-seq_len // sp) * sp - seq_len,
        "comm_bytes_per_link_per_layer": counted,
        "predicted_comm_bytes_per_link_per_layer": predicted,
        "comm_vs_predicted": counted / predicted if predicted else np.nan,
        "comm_bytes_recv_per_link_per_layer": counted,
        "comm_bytes_fwd": counted // 2,
        "predicted_comm_bytes_fwd": predicted // 2,
        "comm_bytes_bwd": counted - counted // 2,
        "predicted_comm_bytes_bwd": predicted // 2,
        "comm_rounds": 8 if sp > 1 else 0,
        "predicted_comm_rounds": 8 if sp > 1 else 0,
        "grad_sync_bytes_per_step": 1000 * (sp > 1),
        "activation_bytes_per_rank": model * activation_off,
        "model_activation_bytes_per_rank": model,
        "activation_vs_model": activation_off,
        "predicted_activation_bytes_per_rank": paper,
        "activation_vs_predicted": model * activation_off / paper,
        "param_bytes": 50_000,
        "grad_bytes": 50_000,
        "peak_bytes": 100_000 + model,
        "memory_budget_bytes": 1 << 30,
        "budget_layers": 4,
        "max_seq_len_in_budget": LONGEST[method] * sp,
        "paper_max_seq_len_in_budget": 500 * sp,
        "step_time_s": 0.01 * sp,
        "max_error": 3e-7 if not wrong else 0.5,
        "tolerance": 1e-4,
        "wrong": wrong,
        "status": "ok",
        "error": "",
        **METADATA,
    }


def results() -> pd.DataFrame:
    """Every method at P = 1, 2, 4 and s = 16, 27; Ring at P = 4, s = 27 counted 10% over
    its formula, Ulysses at P = 2, s = 27 saving 3% more than the model and one wrong
    tensor at P = 4, s = 16; plus a failed Megatron-SP cell at P = 8."""
    rows = []
    for method in LONGEST:
        for sp in (1, 2, 4):
            for seq_len in (16, 27):
                off = {
                    ("ring_attention", 4, 27): {"comm_off": 1.1},
                    ("ulysses", 2, 27): {"activation_off": 1.03},
                    ("ulysses", 4, 16): {"wrong": 1},
                }.get((method, sp, seq_len), {})
                rows.append(_row(method, sp, seq_len, **off))
    failed = {k: np.nan for k in rows[0]}
    failed.update(
        method="megatron_sp",
        sp=8,
        seq_len=16,
        world_size=8,
        status="failed",
        error="RankFailure: rank 5 timed out after 300 s",
        **METADATA,
    )
    return pd.DataFrame([*rows, failed])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "sequence_parallel"
    headline = EXPERIMENT.report_on(results(), out, None)
    return headline, (out / "report.md").read_text(), out


def test_files_and_headline_round_trip(report):
    headline, _, out = report
    for name in (
        "report.md",
        "headline.json",
        "comm_per_link.png",
        "ulysses_vs_megatron.png",
        "activation_per_rank.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "headline.json").read_text()) == headline


def test_ratio_is_counted_at_the_largest_degree_beside_one_over_p(report):
    headline, text, _ = report
    ratio = headline["ulysses_vs_megatron_per_link"]
    assert ratio["sp"] == 4 and ratio["formula"] == pytest.approx(0.25)
    assert ratio["measured"] == pytest.approx(0.25)
    assert "formula 1/P" in text and "Jacobs et al. 2023" in text


def test_a_row_off_its_formula_is_not_counted_exact(report):
    headline, text, _ = report
    comm = headline["comm_rows_equal_formula"]
    assert comm["rows"] == 12 and comm["exact_rows"] == 11  # P > 1 rows only
    assert comm["max_deviation"] == pytest.approx(0.1, rel=1e-3)
    assert "**11 of 12**" in text


def test_activation_model_error_is_the_worst_row_and_longest_is_per_method(report):
    headline, text, _ = report
    memory = headline["activation_model_error"]
    assert memory["max_error"] == pytest.approx(0.03)
    assert memory["by_method"]["ring_attention"] == pytest.approx(0.0)
    longest = headline["longest_seq_len_in_budget"]["longest"]
    assert longest["ulysses"]["4"] == {"model": 8000, "paper": 2000}
    assert longest["megatron_sp"]["1"]["model"] == 1000
    assert "+3.00%" in text and "1 GiB" in text
    figures = {f["figure"]: f for f in headline["figures"]}
    figure = figures[
        "Ulysses: longest s within 1 GiB per rank, 4 layers, P = 4 (validated implementation model)"
    ]
    assert figure["model"] == "8,000" and figure["measured"] == "—"  # a model's output
    assert figure["theory"] == "2,000 (paper formula)" and figure["gap"] == "4.00×"


def test_wrong_tensors_and_failed_cells_are_reported(report):
    headline, text, out = report
    assert headline["wrong_total"] == 1 and headline["failed_cells"] == 1
    assert "**1 tensor(s) wrong**" in text and "**1 wrong**" in text
    assert "rank 5 timed out" in text
    assert headline["failures"][0]["sp"] == 8
    index = write_index(out.parent).read_text()
    assert "Ulysses ÷ Megatron-SP bytes per link per layer, P = 4" in index
    broken = {f["claim"] for f in headline["findings"] if not f["holds"]}
    assert broken == {
        "counted bytes per link equal the papers' formulas in every cell with P > 1",
        "saved activations per rank equal the implementation model in every cell",
    }
    assert "counted bytes per link equal the papers' formulas" in index  # listed as not held


def test_ranks_sharing_cores_are_called_out(report):
    _, text, _ = report
    assert "cells with P > 2 share them" in text
    assert "World sizes above 2" in text


def test_single_rank_and_empty_runs(tmp_path):
    alone = pd.DataFrame([_row(m, 1, 16) for m in LONGEST])
    headline = EXPERIMENT.report_on(alone, tmp_path / "alone", None)
    assert headline["ulysses_vs_megatron_per_link"] is None
    assert headline["comm_rows_equal_formula"] == {"rows": 0}
    assert "No cell has P > 1" in (tmp_path / "alone" / "report.md").read_text()
    failed = results().iloc[[-1]]
    headline = EXPERIMENT.report_on(failed, tmp_path / "failed", None)
    assert headline["failed_cells"] == 1 and headline["wrong_total"] == 0
    assert "1 cells, 0 ran" in (tmp_path / "failed" / "report.md").read_text()


@pytest.mark.parametrize("fill", [0.0, np.nan], ids=["zero", "nan"])
def test_degenerate_figures_hold_no_claim(tmp_path, fill):
    frame = results()
    keep = {*EXPERIMENT.key_columns, "world_size", "host_cores"}
    measured = [
        c for c in frame.columns if c not in keep and pd.api.types.is_numeric_dtype(frame[c])
    ]
    frame[measured] = fill
    headline = EXPERIMENT.report_on(frame, tmp_path, None)
    assert headline["findings"] and not any(f["holds"] for f in headline["findings"])
    assert headline["comm_rows_equal_formula"]["exact_rows"] == 0
