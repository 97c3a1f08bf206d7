"""The `parallelism_comparison` report writer on a small synthetic results table.

The numbers below are fixtures shaped like the experiment's results.csv (one row per
layout), not measurements. A failure here means a generated report would misstate a run:
a ratio to DP taken from the wrong row or world size, a lecture adjective put beside the
wrong strategy, an ordering called agreeing with the lecture when it does not, a failed or
wrong cell that disappears, an ordering that does not hold missing from the index's
findings, a target not judged on every cell it applies to, a report that crashes on
all-zero or all-NaN figures, plots that are not written — or a writer that imports `impls`
(it must read results only).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.experiments.parallelism_comparison.experiment import EXPERIMENT
from bench.report.index import write_index

REPO_ROOT = Path(__file__).resolve().parents[1]
PSI = 10_000
METADATA = {
    "git_sha": "abc1234",
    "torch_version": "2.13.0",
    "backend": "gloo",
    "device": "cpu",
    "host": "testhost",
    "host_cores": 2,
    "timestamp": "2025-01-01T00:00:00",
}
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
        "world_size": n,
        **degrees,
        "layout": layout,
        "strategy": used[0].upper() if len(used) == 1 else f"{len(used)}D",
        "params": PSI,
        "n_layers": 4,
        "d_model": 32,
        "n_heads": 4,
        "seq_len": 16,
        "vocab_size": 64,
        "batch_size": 16,
        "microbatches": 4,
        "schedule": "1f1b",
        "steps": 2,
        "loss": 4.1,
        "loss_error": 0.0,
        "update_error": 1e-6,
        "grad_error": 1e-7,
        "max_param_diff": 2e-7,
        "wrong": wrong,
        "step_time_s": 0.05,
        "util_wall": wall,
        "util_theory": 4 / (4 + degrees["pp"] - 1),
        "param_bytes": states / 4,
        "grad_bytes": states / 4,
        "optim_bytes": states / 2,
        "model_state_bytes": states,
        "model_state_bytes_mean": states,
        "theory_model_state_bytes": 16 * PSI / k,
        "activation_peak_bytes": activations,
        "memory_per_rank_bytes": states + activations,
        "rank_params_max": PSI / k,
        **{f"comm_bytes_{a}": traffic.get(a, 0) for a in ("dp", "pp", "tp")},
        **{f"predicted_comm_bytes_{a}": traffic.get(a, 0) for a in ("dp", "pp", "tp")},
        "comm_bytes_per_step": sum(traffic.values()),
        "predicted_comm_bytes_per_step": sum(traffic.values()),
        "comm_rounds_per_step": 6,
        "util_replayed": util,
        "comm_fraction_replayed": comm,
        "replayed_step_time_s": 0.02,
        "replayed_compute_s": 0.02 * util,
        "replayed_comm_latency_s": 0.02 * comm * 0.9,
        "replayed_comm_bandwidth_s": 0.02 * comm * 0.1,
        "link_alpha_s": 1e-4,
        "link_beta_s_per_byte": 5e-10,
        "tp_call_cpu_s": 2e-4,
        "status": "ok",
        "error": "",
        **METADATA,
    }


def results() -> pd.DataFrame:
    rows = [_row(layout) for layout in LAYOUTS]
    failed = {k: np.nan for k in rows[0]}
    failed.update(
        world_size=8,
        dp=8,
        pp=1,
        tp=1,
        status="failed",
        error="RankFailure: rank 6 timed out after 900 s",
        **METADATA,
    )
    return pd.DataFrame([*rows, failed])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "parallelism_comparison"
    headline = write(results(), out)
    return headline, (out / "report.md").read_text(), out


def write(frame: pd.DataFrame, out: Path) -> dict:
    return EXPERIMENT.report_on(frame, out, None)


def test_files_and_headline_round_trip(report) -> None:
    headline, _, out = report
    for name in (
        "report.md",
        "headline.json",
        "memory_per_rank.png",
        "comm_per_step.png",
        "utilization.png",
    ):
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
    headline, text, out = report
    lines = text.splitlines()
    utilization = next(c for c in lines if c.startswith("- utilization"))
    assert "DP 90.0% > TP 60.0% > PP 55.0%" in utilization and utilization.endswith("holds.")
    comm = next(c for c in lines if c.startswith("- communication"))
    # TP 234 KiB > DP 58.6 KiB > PP 7.8 KiB: the lecture's TP > PP > DP does not hold.
    assert "TP > PP > DP **does not hold**" in comm
    findings = {f["claim"]: f for f in headline["findings"]}
    assert len(findings) == 6  # at N = 4; N = 8 has no pure layout that ran
    util = findings["utilization (replayed) at N = 4: DP > TP > PP, as the lecture's words say"]
    assert util["holds"] and "DP 90.0% > TP 60.0% > PP 55.0%" in util["detail"]
    comm = findings["communication per step at N = 4: TP > PP > DP, as the lecture's words say"]
    assert not comm["holds"] and "TP 234 KiB > DP 58.6 KiB > PP 7.81 KiB" in comm["detail"]
    assert [f["holds"] for f in findings.values()].count(False) == 1
    # The index lists the ordering that does not hold, and only that one.
    index = write_index(out.parent).read_text()
    listed = index.split("## Findings that do not hold")[1].split("## Reports")[0]
    assert "TP > PP > DP" in listed and "DP > TP > PP" not in listed


def test_a_tie_does_not_hold(tmp_path: Path) -> None:
    """Equal figures (e.g. a counter that read zero everywhere) satisfy no ordering."""
    frame = results()
    frame["comm_bytes_per_step"] = 0.0
    headline = write(frame, tmp_path)
    comm = next(f for f in headline["findings"] if f["claim"].startswith("communication"))
    assert not comm["holds"]


def test_targets_are_judged_on_every_cell_they_apply_to(report) -> None:
    headline, _, _ = report
    targets = {t["column"]: t for t in headline["targets"]}
    assert set(targets) == {"comm_count_error", "model_state_vs_theory", "util_vs_bound"}
    # Counts equal the prediction in the fixture: every ran cell, worst gap 0.
    counts = targets["comm_count_error"]
    assert (counts["cells"], counts["measured"], counts["worst"], counts["met"]) == (5, 5, 0, True)
    # TP layouts hold 5% over 16Ψ/k (replicated LayerNorms): the worst is a TP cell.
    states = targets["model_state_vs_theory"]
    assert states["worst"] == pytest.approx(1.05) and "tp=" in states["worst_key"]
    assert states["met"] and states["cells"] == 5
    bubble = targets["util_vs_bound"]  # pp4 alone: 55% of its 4/7 bound
    assert bubble["cells"] == 1 and bubble["worst"] == pytest.approx(0.55 / (4 / 7))
    assert bubble["worst_key"] == "world_size=4, dp=1, pp=4, tp=1" and bubble["met"]


@pytest.mark.parametrize("fill", [0.0, np.nan], ids=["zero", "nan"])
def test_degenerate_figures_still_write_a_report(tmp_path: Path, fill: float) -> None:
    frame = results()
    keep = {"world_size", "dp", "pp", "tp", "host_cores"}
    for column in frame.columns:
        if column not in keep and pd.api.types.is_numeric_dtype(frame[column]):
            frame[column] = fill
    headline = write(frame, tmp_path)
    assert not any(t["met"] for t in headline["targets"])
    assert not any(f["holds"] for f in headline["findings"])
    assert (tmp_path / "utilization.png").stat().st_size > 0


def test_failed_and_wrong_cells_are_reported(tmp_path: Path) -> None:
    frame = results()
    frame.loc[frame["layout"] == "tp4", "wrong"] = 1
    headline = write(frame, tmp_path)
    assert headline["wrong_total"] == 1 and headline["failed_cells"] == 1
    text = (tmp_path / "report.md").read_text()
    assert "**1 wrong**" in text and "rank 6 timed out after 900 s" in text
    assert "| world_size=4, dp=1, pp=1, tp=4 |" in text  # the wrong cell, named
    assert headline["wrong_cells"] == 1 and len(headline["failures"]) == 1


def test_a_run_where_nothing_finished_still_writes_a_report(tmp_path: Path) -> None:
    frame = results()
    frame["status"] = "failed"
    headline = write(frame, tmp_path)
    assert headline["failed_cells"] == len(frame)
    assert (
        "No cell ran, so there is nothing measured to show" in (tmp_path / "report.md").read_text()
    )


def test_index_shows_the_headline_figures(report) -> None:
    _, _, out = report
    index = write_index(out.parent).read_text()
    assert "parallelism_comparison" in index and "PP utilization, replayed" in index


FOLDER = REPO_ROOT / "bench" / "experiments" / "parallelism_comparison"
REPORT_MODULES = ("report.py", "tables.py", "plots.py")


def test_writer_reads_results_only() -> None:
    """The report's modules import no `impls`, and importing them loads no `impls` module
    beyond what the harness's own package already does (`bench.experiments`)."""
    for name in REPORT_MODULES:
        tree = ast.parse((FOLDER / name).read_text())
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m and m.split(".")[0] == "impls"], name
        assert not [m for m in imported if m and m.endswith((".ranks", ".experiment"))], name
    code = (
        "import sys, bench.experiments\n"
        "def impls(): return {m for m in sys.modules if m == 'impls' or m.startswith('impls.')}\n"
        "before = impls()\n"
        "import bench.experiments.parallelism_comparison.report\n"
        "bad = sorted(impls() - before)\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
