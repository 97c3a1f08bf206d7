"""Experiment `delayed_averaging`: its config, grid, rows and report.

A failure here means a bad grid (negative latency, delay < 1, an unknown method) would
start ranks instead of being refused naming the key, a row's time to accuracy is not the
first evaluation at or above the target, or the report compares other numbers than the
rows hold. The real run (DGA faster than sync DP under latency, the link's seconds equal
to steps × latency) is checked in tests/test_reports_ci.py.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from bench.experiments import experiments
from bench.experiments.delayed_averaging.config import DelayedAveragingConfig
from bench.experiments.delayed_averaging.experiment import EXPERIMENT, cells, to_row
from bench.experiments.delayed_averaging.ranks import Link


def write_report(df: pd.DataFrame, report_dir) -> dict:
    return EXPERIMENT.report_on(df, report_dir, None)


def test_registered():
    assert experiments()["delayed_averaging"] is EXPERIMENT


@pytest.mark.parametrize(
    "values, needles",
    [
        ({"latencies_ms": [10, -5]}, ["latencies_ms=[10, -5]", "≥ 0"]),
        ({"latencies_ms": []}, ["latencies_ms"]),
        ({"delays": [0]}, ["delays", "≥ 1"]),
        ({"methods": ["async"]}, ["methods", "async", "sync", "dga"]),
        ({"bandwidth_mbps": 0}, ["bandwidth_mbps=0"]),
        ({"target_accuracy": 1.5}, ["target_accuracy"]),
        ({"batch_size": 30}, ["batch_size=30", "world_size=4"]),
        ({"lr": 0}, ["lr"]),
        ({"steps": 0}, ["steps"]),
    ],
)
def test_bad_config_is_refused_naming_the_key(values, needles):
    with pytest.raises(ValueError) as error:
        EXPERIMENT.parse(values)
    for needle in needles:
        assert needle in str(error.value), (needle, str(error.value))


def test_grid_runs_sync_once_per_latency_and_dga_per_delay():
    grid = cells(DelayedAveragingConfig(latencies_ms=[0, 100], delays=[2, 8]))
    keys = [(c.key["latency_ms"], c.key["method"], c.key["delay"]) for c in grid]
    assert keys == [
        (0.0, "sync", 0),
        (0.0, "dga", 2),
        (0.0, "dga", 8),
        (100.0, "sync", 0),
        (100.0, "dga", 2),
        (100.0, "dga", 8),
    ]
    assert all(c.world_size == 4 for c in grid)
    assert [c.carry for c in grid] == [Link(0.0)] * 3 + [Link(100.0)] * 3
    assert DelayedAveragingConfig().target_accuracy == 0.95
    (linked,) = cells(
        DelayedAveragingConfig(latencies_ms=[5], bandwidth_mbps=100, methods=["sync"])
    )
    assert linked.carry == Link(5.0, 100.0)
    assert linked.carry.network().bandwidth_bps == 100e6


def _per_rank(accs: list[float], times: list[float]) -> list[dict]:
    evals = [
        (10 * (i + 1), t, 1.0 - a, a) for i, (a, t) in enumerate(zip(accs, times, strict=True))
    ]
    return [
        {
            "evals": evals,
            "losses": [1.0],
            "train_time_s": times[-1] + r,
            "waited_s": 0.1 * r,
            "simulated_s": 2.0,
        }
        for r in range(4)
    ]


def test_row_takes_the_first_evaluation_at_or_above_the_target():
    cfg = DelayedAveragingConfig(latencies_ms=[50], delays=[4], methods=["dga"])
    cell = cells(cfg)[0]
    row = to_row(cfg, cell, _per_rank([0.5, 0.95, 0.94, 0.97], [1.0, 2.0, 3.0, 4.0]))
    assert row["time_to_target_s"] == 2.0 and row["steps_to_target"] == 20
    assert row["train_time_s"] == 4.0 + 3 and row["waited_s"] == pytest.approx(0.3)
    assert row["final_accuracy"] == 0.97 and json.loads(row["eval_curve"])[1] == [
        20,
        2.0,
        0.05,
        0.95,
    ]
    never = to_row(cfg, cell, _per_rank([0.5, 0.6], [1.0, 2.0]))
    assert math.isnan(never["time_to_target_s"]) and math.isnan(never["steps_to_target"])


def _frame(sync_time: float, dga_time: float) -> pd.DataFrame:
    rows = []
    cfg = DelayedAveragingConfig(latencies_ms=[0, 100], delays=[4])
    for cell in cells(cfg):
        slow = cell.key["method"] == "sync" and cell.key["latency_ms"] > 0
        t = sync_time if slow else dga_time
        rows.append(
            {
                **to_row(cfg, cell, _per_rank([0.9, 0.96], [t / 2, t])),
                "status": "ok",
                "error": "",
                "git_sha": "abc",
                "torch_version": "2.13.0",
                "backend": "gloo",
                "device": "cpu",
                "host": "h",
                "host_cores": 2,
                "timestamp": "2026-01-01T00:00:00",
            }
        )
    return pd.DataFrame(rows)


def test_report_reads_the_speedup_from_the_rows(tmp_path):
    headline = write_report(_frame(sync_time=30.0, dga_time=3.0), tmp_path)
    for name in ("report.md", "time_to_accuracy.png", "curves.png", "headline.json"):
        assert (tmp_path / name).stat().st_size > 0
    best = headline["at_largest_latency"]
    assert best["latency_ms"] == 100 and best["sync_s"] == 30.0 and best["dga_s"] == 3.0
    assert best["speedup"] == pytest.approx(10.0)
    text = (tmp_path / "report.md").read_text()
    assert "sooner than sync DP's 30 s" in text and "10.00×" in text
    # The target is judged on every DGA cell under a latency: here the one at 100 ms.
    (target,) = headline["targets"]
    assert target["where"] == {"method": "dga", "under_latency": True}
    assert (target["cells"], target["median"], target["met"]) == (1, pytest.approx(10.0), True)
    assert "latency_ms=100" in target["worst_text"]
    slower = write_report(_frame(sync_time=3.0, dga_time=6.0), tmp_path / "slow")
    assert slower["at_largest_latency"]["speedup"] == pytest.approx(0.5)
    assert "**not sooner** than" in (tmp_path / "slow" / "report.md").read_text()
    (target,) = slower["targets"]
    assert target["worst"] == pytest.approx(0.5) and not target["met"]


def test_report_without_finished_cells(tmp_path):
    df = _frame(30.0, 3.0).assign(status="failed", error="rank 1 died")
    headline = write_report(df, tmp_path)
    assert (
        "No cell ran, so there is nothing measured to show" in (tmp_path / "report.md").read_text()
    )
    assert headline["failed_cells"] == 4
