"""The `parallelism_comparison` report writer on a small synthetic results table.

The numbers below are fixtures shaped like the experiment's results.csv (one row per
layout), not measurements. A failure here means a generated report would misstate a run:
a ratio to DP taken from the wrong row or world size, a lecture adjective put beside the
wrong strategy, an ordering called agreeing with the lecture when it does not, a failed or
wrong cell that disappears, plots that are not written — or a writer that imports `impls`
(it must read results only).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.reports import parallelism_comparison
from bench.reports.index import write_index

REPO_ROOT = Path(__file__).resolve().parents[1]
PSI = 10_000
METADATA = {"git_sha": "abc1234", "torch_version": "2.13.0", "backend": "gloo", "device": "cpu",
            "host": "testhost", "host_cores": 2, "timestamp": "2025-01-01T00:00:00"}  # fmt: skip
# layout -> (util_replayed, comm fraction, util_wall, comm bytes per axis, activations)
LAYOUTS = {
    "dp4": (0.90, 0.05, 0.70, {"dp": 60_000}, 1000),
    "tp4": (0.60, 0.38, 0.10, {"tp": 240_000}, 2000),
    "pp4": (0.55, 0.01, 0.40, {"pp": 8_000}, 4000),
    "dp2×tp2": (0.70, 0.25, 0.20, {"dp": 20_000, "tp": 80_000}, 1500),
    "dp2×pp2×tp2": (0.50, 0.20, 0.10, {"dp": 10_000, "pp": 4_000, "tp": 40_000}, 1500),
}


def _row(layout: str, wrong: int = 0) -> dict:
    util, comm, wall, traffic, activations = LAYOUTS[layout]
    degrees = {axis: 1 for axis in ("dp", "pp", "tp")}
    for part in layout.split("×"):
        degrees[part[:2]] = int(part[2:])
    n = degrees["dp"] * degrees["pp"] * degrees["tp"]
    k = degrees["pp"] * degrees["tp"]
    used = [a for a in degrees if degrees[a] > 1]
    states = 16 * PSI / k * (1.05 if degrees["tp"] > 1 else 1.0)  # TP: replicated LayerNorms
    return {
        "world_size": n, **degrees, "layout": layout,
        "strategy": used[0].upper() if len(used) == 1 else f"{len(used)}D",
        "params": PSI, "n_layers": 4, "d_model": 32, "n_heads": 4, "seq_len": 16,
        "vocab_size": 64, "batch_size": 16, "microbatches": 4, "schedule": "1f1b", "steps": 2,
        "loss": 4.1, "loss_error": 0.0, "update_error": 1e-6, "grad_error": 1e-7, "max_param_diff": 2e-7,
        "wrong": wrong, "step_time_s": 0.05, "util_wall": wall,
        "util_theory": 4 / (4 + degrees["pp"] - 1),
        "param_bytes": states / 4, "grad_bytes": states / 4, "optim_bytes": states / 2,
        "model_state_bytes": states, "model_state_bytes_mean": states,
        "theory_model_state_bytes": 16 * PSI / k, "activation_peak_bytes": activations,
        "memory_per_rank_bytes": states + activations, "rank_params_max": PSI / k,
        **{f"comm_bytes_{a}": traffic.get(a, 0) for a in ("dp", "pp", "tp")},
        **{f"predicted_comm_bytes_{a}": traffic.get(a, 0) for a in ("dp", "pp", "tp")},
        "comm_bytes_per_step": sum(traffic.values()),
        "predicted_comm_bytes_per_step": sum(traffic.values()), "comm_rounds_per_step": 6,
        "util_replayed": util, "comm_fraction_replayed": comm, "replayed_step_time_s": 0.02,
        "replayed_compute_s": 0.02 * util, "replayed_comm_latency_s": 0.02 * comm * 0.9,
        "replayed_comm_bandwidth_s": 0.02 * comm * 0.1,
        "link_alpha_s": 1e-4, "link_beta_s_per_byte": 5e-10, "tp_call_cpu_s": 2e-4,
        "status": "ok", "error": "", **METADATA,
    }  # fmt: skip


def results() -> pd.DataFrame:
    rows = [_row(layout) for layout in LAYOUTS]
    failed = {k: np.nan for k in rows[0]}
    failed.update(world_size=8, dp=8, pp=1, tp=1, status="failed",
                  error="RankFailure: rank 6 timed out after 900 s", **METADATA)  # fmt: skip
    return pd.DataFrame([*rows, failed])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "parallelism_comparison"
    headline = parallelism_comparison.write_report(results(), out)
    return headline, (out / "report.md").read_text(), out


def test_files_and_headline_round_trip(report) -> None:
    headline, _, out = report
    for name in ("report.md", "headline.json", "memory_per_rank.png", "comm_per_step.png",
                 "utilization.png"):  # fmt: skip
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "headline.json").read_text()) == headline


def test_ratios_to_dp_come_from_the_pure_layouts_at_the_same_world_size(report) -> None:
    headline, _, _ = report
    four = headline["by_world_size"]["4"]
    assert four["tp_model_states_vs_dp"] == pytest.approx(0.25 * 1.05)
    assert four["pp_model_states_vs_dp"] == pytest.approx(0.25)
    assert four["tp_comm_vs_dp"] == pytest.approx(4.0)
    assert (four["pp_util_replayed"], four["pp_util_bound"]) == (0.55, pytest.approx(4 / 7))
    assert headline["by_world_size"]["8"] == {}  # the 8-rank DP failed: no ratio to make
    figures = {f["figure"]: f for f in headline["figures"]}
    pp = figures["PP utilization, replayed, N = 4, M = 4"]
    assert (pp["theory"], pp["measured"], pp["gap"]) == ("57.1%", "55.0%", "-2.1 pts")
    tp = figures["TP model states per rank (mean) ÷ DP's, N = 4"]
    assert (tp["theory"], tp["measured"]) == ("1/4 = 0.250", "0.263")
    assert figures["TP communication per step ÷ DP's, N = 4"]["measured"] == "4.00×"
    dp = figures["DP utilization, replayed, N = 4, M = 4"]
    assert (dp["theory"], dp["measured"], dp["gap"]) == ("high (lecture)", "90.0%", "—")
    assert four["dp_util_replayed"] == 0.90


def test_table_puts_the_lecture_beside_each_strategy(report) -> None:
    _, text, _ = report
    dp_line = next(line for line in text.splitlines() if line.startswith("| DP "))
    assert "| high " in dp_line and "| low " in dp_line and "90.0%" in dp_line
    pp_line = next(line for line in text.splitlines() if line.startswith("| PP "))
    assert "| medium " in pp_line and "55.0%" in pp_line and "57.1%" in pp_line
    assert "| 3D " in text and "dp2×pp2×tp2" in text
    # TP's replayed communication: 0.02 s × 0.38, nine tenths of it latency.
    assert "in 6 rounds per step, and 90.0% of that is latency" in text


def test_orderings_are_checked_against_the_lecture(report) -> None:
    headline, _, _ = report
    checks = headline["lecture_checks"]
    utilization = next(c for c in checks if c.startswith("- utilization"))
    assert "DP 90.0% > TP 60.0% > PP 55.0%" in utilization and utilization.endswith("holds.")
    comm = next(c for c in checks if c.startswith("- communication"))
    # TP 234 KiB > DP 58.6 KiB > PP 7.8 KiB: the lecture's TP > PP > DP does not hold.
    assert "TP > PP > DP **does not hold**" in comm


def test_failed_and_wrong_cells_are_reported(tmp_path: Path) -> None:
    frame = results()
    frame.loc[frame["layout"] == "tp4", "wrong"] = 1
    headline = parallelism_comparison.write_report(frame, tmp_path)
    assert headline["wrong_total"] == 1 and headline["failed_cells"] == 1
    text = (tmp_path / "report.md").read_text()
    assert "**1 layout(s) wrong**" in text and "rank 6 timed out after 900 s" in text
    figures = {f["figure"]: f["measured"] for f in headline["figures"]}
    assert figures["wrong layouts"] == "1" and figures["failed cells"] == "1"


def test_a_run_where_nothing_finished_still_writes_a_report(tmp_path: Path) -> None:
    frame = results()
    frame["status"] = "failed"
    headline = parallelism_comparison.write_report(frame, tmp_path)
    assert headline["failed_cells"] == len(frame)
    assert "No cell finished" in (tmp_path / "report.md").read_text()


def test_index_shows_the_headline_figures(report) -> None:
    _, _, out = report
    index = write_index(out.parent).read_text()
    assert "parallelism_comparison" in index and "PP utilization, replayed" in index


def test_writer_reads_results_only() -> None:
    code = (
        "import sys, bench.reports.parallelism_comparison\n"
        "bad = sorted(m for m in sys.modules if m == 'impls' or m.startswith('impls.'))\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
