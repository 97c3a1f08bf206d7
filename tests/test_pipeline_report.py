"""The `pipeline_utilization` report writer on synthetic results built from the bounds.

A failure here means a generated report would misstate what was measured: the lecture's
25% / 57% rows missing or taken from the wrong cell, a broken in-flight limit reported as
holding, a torch ratio computed the wrong way round, failed cells that vanish, plots or
Gantt charts that are not drawn — or a report writer that imports `impls` (it must read
results only).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.reports.index import write_index
from bench.reports.pipeline_utilization import write_report

REPO_ROOT = Path(__file__).resolve().parents[1]
METADATA = {"git_sha": "abc1234", "torch_version": "2.13.0", "backend": "gloo", "device": "cpu",
            "host": "testhost", "host_cores": 2, "timestamp": "2026-01-01T00:00:00"}  # fmt: skip
MICROBATCHES = [1, 2, 4, 8]
V = 2


def _theory(schedule: str, p: int, m: int) -> float:
    return {
        "naive": 1 / p,
        "gpipe": m / (m + p - 1),
        "1f1b": m / (m + p - 1),
        "interleaved_1f1b": m / (m + (p - 1) / V),
        "zero_bubble_h1": 3 * m / (3 * m + p - 1) if m >= p else np.nan,
    }[schedule]


def _applies(schedule: str, p: int, m: int) -> bool:
    if schedule == "naive":
        return m == 1
    if "interleaved" in schedule:
        return m % p == 0
    return not (schedule == "torch_1f1b" and m < p)


def _inflight(schedule: str, p: int, m: int) -> int:
    return {"gpipe": m, "naive": 1}.get(schedule, min(m, p) if "interleaved" not in schedule else m)


def synthetic(stages=(2, 4)) -> pd.DataFrame:
    """Replayed = 98% of the bound, wall = 85%; distbench 5% slower than torch."""
    rows = []
    for p in stages:
        for schedule in ["naive", "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble_h1"]:
            for m in MICROBATCHES:
                if not _applies(schedule, p, m):
                    continue
                theory = _theory(schedule, p, m)
                replayed = 0.98 * (theory if np.isfinite(theory) else 0.5)
                rows.append({
                    "schedule": schedule, "stages": p, "microbatches": m,
                    "virtual_stages": V if "interleaved" in schedule else 1, "impl": "distbench",
                    "util_wall": 0.85 * replayed, "util_replayed": replayed,
                    "util_theory": theory, "bubble_fraction": 1 - replayed,
                    "step_time_s": 0.105 * (1 + 1 / m),
                    "peak_activation_bytes": _inflight(schedule, p, m) * 2**20 / m,
                    "max_inflight_microbatches": _inflight(schedule, p, m),
                    "max_inflight_plan": _inflight(schedule, p, m), "loss": 4.2,
                    "trace_file": "", "spans_file": "", "repeats": 3, "n_layers": 8,
                    "d_model": 64, "n_heads": 4, "seq_len": 16, "vocab_size": 64,
                    "batch_size": 8, "status": "ok", "error": "", "world_size": p, **METADATA,
                })  # fmt: skip
        for schedule in ["torch_gpipe", "torch_1f1b", "torch_interleaved_1f1b"]:
            for m in MICROBATCHES:
                if _applies(schedule, p, m):
                    rows.append({
                        "schedule": schedule, "stages": p, "microbatches": m,
                        "virtual_stages": V if "interleaved" in schedule else 1,
                        "impl": "torch", "step_time_s": 0.1 * (1 + 1 / m), "loss": 4.2,
                        "status": "ok", "error": "", "world_size": p, **METADATA,
                    })  # fmt: skip
    return pd.DataFrame(rows)


def write_spans(report_dir: Path, df: pd.DataFrame, schedule: str, p: int, m: int) -> None:
    """Textbook spans (F = 1, B = 2) for one cell, as the experiment writes them."""
    rows = []
    for timeline in ("replayed", "wall"):
        for r in range(p):
            for k in range(m):
                rows.append([timeline, r, f"{r}F{k}", r, "F", k, r + k, r + k + 1.0])
                start = m + p - 1 + 2 * (p - 1 - r) + 2 * k
                rows.append([timeline, r, f"{r}B{k}", r, "B", k, start, start + 2.0])
    spans = pd.DataFrame(rows, columns=["timeline", "rank", "action", "stage", "kind", "microbatch", "start_s", "end_s"])  # fmt: skip
    name = f"traces/{schedule}_p{p}_m{m}"
    (report_dir / "traces").mkdir(parents=True, exist_ok=True)
    spans.to_csv(report_dir / f"{name}_spans.csv", index=False)
    (report_dir / f"{name}.json").write_text('{"traceEvents": []}')
    hit = (df["schedule"] == schedule) & (df["stages"] == p) & (df["microbatches"] == m)
    df.loc[hit, ["spans_file", "trace_file"]] = [f"{name}_spans.csv", f"{name}.json"]


@pytest.fixture
def traced(tmp_path):
    df = synthetic()
    write_spans(tmp_path, df, "naive", 4, 1)
    write_spans(tmp_path, df, "gpipe", 4, 4)
    return df, tmp_path


def test_every_artefact_is_written(traced):
    df, report_dir = traced
    headline = write_report(df, report_dir)
    for name in ["report.md", "headline.json", "utilization_vs_m.png", "activation_memory.png",
                 "gantt_naive_vs_gpipe.png"]:  # fmt: skip
        assert (report_dir / name).stat().st_size > 0, name
    assert json.loads((report_dir / "headline.json").read_text()) == headline
    text = (report_dir / "report.md").read_text()
    assert text.index("lecture's figure") < text.index("Utilization against micro-batches")
    for needle in ["replayed", "wall clock", "Narayanan et al. 2021", "Qi et al. 2024",
                   "gantt_naive_vs_gpipe.png", "traces/gpipe_p4_m4.json"]:  # fmt: skip
        assert needle in text, needle


def test_lecture_rows_come_from_their_cells(traced):
    df, report_dir = traced
    headline = write_report(df, report_dir)
    assert headline["naive_p4_util_replayed"] == pytest.approx(0.98 * 0.25)
    assert headline["gpipe_p4_m4_util_replayed"] == pytest.approx(0.98 * 4 / 7)
    assert headline["gpipe_p4_m4_util_wall"] == pytest.approx(0.85 * 0.98 * 4 / 7)
    naive, gpipe = headline["figures"][:2]
    assert (naive["theory"], gpipe["theory"]) == ("25%", "57%")
    assert naive["measured"].startswith("24.5% replayed") and naive["gap"] == "-0.5 pts"
    assert gpipe["measured"].startswith("56.0% replayed") and gpipe["gap"] == "-1.1 pts"
    assert "lecture" in naive["source"] and "wall clock" in naive["measured"]


def test_inflight_limits_are_checked_not_assumed(traced):
    df, report_dir = traced
    assert write_report(df, report_dir)["inflight_checks"] == {
        "1F1B in-flight ≤ P": True,
        "GPipe in-flight = M": True,
    }
    broken = df.copy()
    hit = (broken["schedule"] == "1f1b") & (broken["stages"] == 4) & (broken["microbatches"] == 8)
    broken.loc[hit, "max_inflight_microbatches"] = 5
    headline = write_report(broken, report_dir)
    assert headline["inflight_checks"]["1F1B in-flight ≤ P"] is False
    figure = next(f for f in headline["figures"] if f["figure"].startswith("1F1B"))
    assert (figure["measured"], figure["gap"]) == ("5", "exceeds")
    assert "**violated**" in (report_dir / "report.md").read_text()


def test_torch_ratio_is_distbench_over_torch_at_two_stages(traced):
    df, report_dir = traced
    ratios = write_report(df, report_dir)["step_time_vs_torch"]
    assert set(ratios) == {"gpipe", "1f1b", "interleaved_1f1b"}
    for found in ratios.values():
        assert found["stages"] == 2 and found["ratio"] == pytest.approx(1.05)
        assert found["basis"] == "separate cells"
    assert ratios["1f1b"]["microbatches"] == [2, 4, 8]  # torch's 1F1B needs M ≥ P
    figures = [f for f in write_report(df, report_dir)["figures"] if "torch" in f["figure"]]
    assert [f["measured"] for f in figures] == ["1.05×", "1.05×"]  # gpipe and 1f1b only


def test_paired_ratio_is_preferred_to_separate_cells(traced):
    df, report_dir = traced
    gpipe = (df["schedule"] == "gpipe") & (df["stages"] == 2)
    df.loc[gpipe, "step_time_vs_torch"] = 0.9  # the side-by-side ratio, measured in-cell
    df.loc[gpipe, "torch_step_time_s"] = df.loc[gpipe, "step_time_s"] / 0.9
    ratios = write_report(df, report_dir)["step_time_vs_torch"]
    assert ratios["gpipe"] == {"stages": 2, "ratio": pytest.approx(0.9),
                               "microbatches": [1, 2, 4, 8], "basis": "paired"}  # fmt: skip
    assert ratios["1f1b"]["ratio"] == pytest.approx(1.05)  # no paired column: cells


def test_failed_cells_are_listed(traced):
    df, report_dir = traced
    failed = pd.DataFrame([{"schedule": "zero_bubble_h1", "stages": 4, "microbatches": 8,
                            "virtual_stages": 1, "status": "failed",
                            "error": "RankFailure: rank 2 timed out"}])  # fmt: skip
    df = pd.concat([df[~((df["schedule"] == "zero_bubble_h1") & (df["microbatches"] == 8))
                       & ~((df["schedule"] == "zero_bubble_h1") & (df["stages"] == 2))], failed])  # fmt: skip
    headline = write_report(df, report_dir)
    assert headline["failed_cells"] == 1
    assert headline["failures"][0]["error"] == "RankFailure: rank 2 timed out"
    assert "rank 2 timed out" in (report_dir / "report.md").read_text()


def test_without_traces_or_cells_the_report_says_so(tmp_path):
    df = synthetic(stages=(2,))
    headline = write_report(df, tmp_path)
    assert headline["naive_p4_util_replayed"] is None  # P = 4 was not in this grid
    assert headline["figures"][0]["measured"] == "not measured"
    assert not (tmp_path / "gantt_naive_vs_gpipe.png").exists()
    assert "No traced naive/GPipe cell" in (tmp_path / "report.md").read_text()
    every_failed = pd.DataFrame([{"schedule": "gpipe", "stages": 4, "microbatches": 4,
                                  "virtual_stages": 1, "status": "failed", "error": "boom"}])  # fmt: skip
    headline = write_report(every_failed, tmp_path / "failed")
    assert headline["failed_cells"] == 1 and (tmp_path / "failed" / "report.md").exists()


def test_index_shows_the_headline_figures(traced):
    df, report_dir = traced
    root = report_dir.parent
    (root / "pipeline_utilization").mkdir(exist_ok=True)
    write_report(df, root / "pipeline_utilization")
    index = write_index(root).read_text()
    assert "naive pipeline utilization, 4 stages" in index and "57%" in index


def test_writer_reads_results_only():
    code = (
        "import sys, bench.reports.pipeline_utilization\n"
        "bad = sorted(m for m in sys.modules if m == 'impls' or m.startswith('impls.'))\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
