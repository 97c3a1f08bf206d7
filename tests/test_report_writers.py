"""Report writers on synthetic results built from the exact traffic formulas.

A failure here means a generated report would misstate what was measured: a lecture row
marked ✗ although the counters follow the lecture's order, a headline figure that is
missing or taken from the wrong cell, failed cells that vanish from the report, or plots
that are not written.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.experiments.allreduce_scaling import experiment as allreduce_experiment
from bench.experiments.allreduce_scaling.config import declared_columns
from bench.experiments.collectives import experiment as collectives_experiment
from bench.report import format_bytes
from bench.report.index import write_index
from impls.collectives.algorithms import ALGORITHMS
from tests.report_guards import assert_import_loads_none, assert_source_imports_none

# The lecture's orders as the algorithms' specs declare them; the report reads them from
# the rows' `lecture_order_*` columns (`declared_columns`), never from `impls`.
LECTURE_ORDERS = {name: dict(spec.orders) for name, spec in ALGORITHMS.items() if spec.orders}

ALPHA_S = 40e-6
BETA_S_PER_BYTE = 1 / 2e9
METADATA = {
    "git_sha": "abc1234",
    "torch_version": "2.5.0",
    "backend": "gloo",
    "device": "cpu",
    "host": "testhost",
    "host_cores": 2,
    "timestamp": "2025-01-01T00:00:00",
}
MESSAGES = [4 * 2**10 * 4**k for k in range(7)]  # 4 KiB ... 16 MiB
MESSAGES.append(64 * 2**20)


def _traffic(algorithm: str, n: int, m: int) -> tuple[int, float, float]:
    """(rounds, peak per-rank bytes, total bytes) as the issue gives them."""
    log_n = math.ceil(math.log2(n))
    return {
        "parameter_server": (2, (n - 1) * m, 2 * (n - 1) * m),
        "sequential": (2 * (n - 1), (n - 1) * m, 2 * (n - 1) * m),
        "ring": (2 * (n - 1), 2 * (n - 1) * m / n, 2 * (n - 1) * m),
        "parallel": (1, (n - 1) * m, n * (n - 1) * m),
        "recursive_halving": (2 * log_n, 2 * (n - 1) * m / n, 2 * (n - 1) * m),
        "tree": (2 * log_n, log_n * m, 2 * (n - 1) * m),
    }[algorithm]


def _allreduce_row(algorithm: str, n: int, m: int) -> dict:
    if algorithm == "torch":
        rounds, peak, _ = _traffic("ring", n, m)
        time = (ALPHA_S * rounds + BETA_S_PER_BYTE * peak) * 0.8  # ring busbw = 0.8 x torch
        counters = dict.fromkeys(
            ["rounds", "max_rank_bytes_sent", "max_rank_bytes_recv", "total_bytes_sent"], np.nan
        )
        counters["messages"] = np.nan
        paired = np.nan
    else:
        rounds, peak, total = _traffic(algorithm, n, m)
        time = ALPHA_S * rounds + BETA_S_PER_BYTE * peak
        counters = {
            "rounds": rounds,
            "max_rank_bytes_sent": peak,
            "max_rank_bytes_recv": peak,
            "total_bytes_sent": total,
            "messages": rounds,
        }
        # torch timed beside it: its time is 0.8 × ring's, so ring's busbw is 0.8× torch's
        paired = 0.8 if algorithm == "ring" else np.nan
    algbw = m / time / 1e9
    return {
        "algorithm": algorithm,
        "world_size": n,
        "message_bytes": m,
        "dtype": "float32",
        "time_s": time,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * 2 * (n - 1) / n,
        **counters,
        "busbw_vs_torch": paired,
        "wrong": 0,
        "status": "ok",
        "error": "",
        **METADATA,
        **declared_columns(algorithm),  # what the experiment writes from the spec
    }


def allreduce_frame(world_sizes=(2, 4, 8), failed: bool = True) -> pd.DataFrame:
    algorithms = [*ALGORITHMS, "torch"]
    rows = [_allreduce_row(a, n, m) for a in algorithms for n in world_sizes for m in MESSAGES]
    if failed:
        broken = _allreduce_row("parallel", 8, 64 * 2**20)
        for column in ("time_s", "algbw_gbps", "busbw_gbps", "rounds", "wrong", "messages"):
            broken[column] = np.nan
        broken.update(status="failed", error="TimeoutError: rank 3 hung past timeout_s=60")
        rows = [
            r
            for r in rows
            if (r["algorithm"], r["world_size"], r["message_bytes"]) != ("parallel", 8, 64 * 2**20)
        ] + [broken]
    return pd.DataFrame(rows)


def write_allreduce(frame: pd.DataFrame, report_dir: Path) -> dict:
    return allreduce_experiment.EXPERIMENT.report_on(frame, report_dir, None)


def write_collectives(frame: pd.DataFrame, report_dir: Path) -> dict:
    return collectives_experiment.EXPERIMENT.report_on(frame, report_dir, None)


def test_allreduce_report_files_and_headline(tmp_path: Path) -> None:
    headline = write_allreduce(allreduce_frame(), tmp_path)
    for name in (
        "report.md",
        "headline.json",
        "busbw_vs_n.png",
        "traffic_vs_n.png",
        "time_vs_size.png",
    ):
        assert (tmp_path / name).stat().st_size > 0, name
    assert json.loads((tmp_path / "headline.json").read_text()) == headline
    target, auto = headline["targets"]  # ring ≥ 0.9× torch at 64 MiB, judged on every N
    assert auto["cells"] == 0 and auto["status"].startswith("not measured")  # no auto rows
    assert target["where"] == {"algorithm": "ring", "message_bytes": 64 * 2**20}
    assert (target["cells"], target["measured"]) == (3, 3)
    assert target["median"] == pytest.approx(0.8) and target["worst"] == pytest.approx(0.8)
    assert not target["met"] and target["status"].startswith("not met in 3 of 3 cells")
    assert "8 ranks" not in target["worst_text"] or "cores" in target["worst_text"]
    assert headline["ring_vs_torch_by_world_size"] == pytest.approx({"2": 0.8, "4": 0.8, "8": 0.8})
    assert headline["wrong_total"] == 0
    assert headline["failed_cells"] == 1
    assert headline["alpha_s"] == pytest.approx(ALPHA_S, rel=1e-6)
    assert headline["beta_gbps"] == pytest.approx(2.0, rel=1e-6)
    assert {f["figure"] for f in headline["figures"]} >= {"α–β fit, all algorithms"}
    report = (tmp_path / "report.md").read_text()
    assert "`testhost` (2 cores" in report and "git `abc1234`" in report
    assert "ranks share cores" in report  # 8 ranks on 2 cores


def test_allreduce_growth_matches_every_lecture_row(tmp_path: Path) -> None:
    headline = write_allreduce(allreduce_frame(), tmp_path)
    matches = headline["growth_matches_lecture"]
    assert set(matches) == set(LECTURE_ORDERS)
    for algorithm, lecture in LECTURE_ORDERS.items():
        assert matches[algorithm] == dict.fromkeys(lecture, True), algorithm
    report = (tmp_path / "report.md").read_text()
    section = report.split("## The lecture's comparison table")[1].split("\n## ")[0]
    assert "✗" not in section
    assert all(f["holds"] for f in headline["findings"])
    for algorithm, lecture in LECTURE_ORDERS.items():
        rows = [line for line in section.splitlines() if line.startswith(f"| {algorithm} ")]
        summary, details = rows[0], rows[1:]
        assert summary.count("✓") == len(lecture), summary
        assert sum("✓" in line for line in details) == len(lecture), algorithm


def test_allreduce_report_lists_failed_cells(tmp_path: Path) -> None:
    write_allreduce(allreduce_frame(), tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "Failed cells (1)" in report
    assert "rank 3 hung past timeout_s=60" in report
    assert "extrapolation, not a measurement" in report.lower()


def test_allreduce_target_without_its_cells_is_not_measured(tmp_path: Path) -> None:
    frame = allreduce_frame(failed=False)
    frame = frame[frame["message_bytes"] < 64 * 2**20]
    headline = write_allreduce(frame, tmp_path)
    target, _auto = headline["targets"]
    assert target["where"]["algorithm"] == "ring"
    assert target["cells"] == 0 and not target["met"]
    assert target["status"].startswith("not measured")
    assert headline["ring_vs_torch_by_world_size"] == pytest.approx({"2": 0.8, "4": 0.8, "8": 0.8})
    assert headline["failed_cells"] == 0


def test_allreduce_report_flags_wrong_elements(tmp_path: Path) -> None:
    frame = allreduce_frame(failed=False)
    frame.loc[frame.index[0], "wrong"] = 7
    headline = write_allreduce(frame, tmp_path)
    assert headline["wrong_total"] == 7 and headline["wrong_cells"] == 1
    report = (tmp_path / "report.md").read_text()
    assert "**1 wrong**" in report
    assert (
        "| algorithm=parameter_server, world_size=2, message_bytes=4096, dtype=float32 | 7"
        in report
    )


def test_allreduce_report_survives_an_all_failed_grid(tmp_path: Path) -> None:
    frame = allreduce_frame(failed=False)
    frame = frame.assign(status="failed", error="RuntimeError: no ranks started", time_s=np.nan)
    headline = write_allreduce(frame, tmp_path)
    assert headline["failed_cells"] == len(frame)
    assert headline["targets"][0]["measured"] == 0
    assert headline.get("alpha_s") is None
    assert "no ranks started" in (tmp_path / "report.md").read_text()


BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def collectives_frame() -> pd.DataFrame:
    rows = []
    for collective, factor in BUS_FACTORS.items():
        for impl in ("distbench", "torch"):
            for n in (2, 4, 8):
                for m in MESSAGES[:4]:
                    time = ALPHA_S * n + BETA_S_PER_BYTE * m * factor(n)
                    time *= 1.0 if impl == "distbench" else 0.5  # torch twice as fast
                    algbw = m / time / 1e9
                    rows.append(
                        {
                            "collective": collective,
                            "impl": impl,
                            "world_size": n,
                            "message_bytes": m,
                            "time_s": time,
                            "algbw_gbps": algbw,
                            "busbw_gbps": algbw * factor(n),
                            "bus_factor": factor(n),
                            "rounds": np.nan if impl == "torch" else n - 1,
                            "max_rank_bytes_sent": np.nan if impl == "torch" else m,
                            "total_bytes_sent": np.nan if impl == "torch" else m * n,
                            "busbw_vs_torch": np.nan if impl == "torch" else 0.5,
                            "wrong": 0,
                            "status": "ok",
                            "error": "",
                            **METADATA,
                        }
                    )
    rows[-1].update(status="failed", error="RuntimeError: gloo connection reset", time_s=np.nan)
    rows[-1].update(algbw_gbps=np.nan, busbw_gbps=np.nan, wrong=np.nan)
    return pd.DataFrame(rows)


def test_collectives_report(tmp_path: Path) -> None:
    headline = write_collectives(collectives_frame(), tmp_path)
    for name in ("report.md", "headline.json", "busbw_by_collective.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert headline["min_ratio"] == pytest.approx(0.5)
    per_collective = [f for f in headline["figures"] if "median over N" in f["figure"]]
    assert {f["figure"].split()[0] for f in per_collective} == set(BUS_FACTORS)
    for figure in per_collective:  # median and worst cell both shown
        assert figure["measured"].startswith("0.50× (worst 0.50×, N="), figure
    assert headline["wrong_total"] == 0
    assert headline["failed_cells"] == 1
    report = (tmp_path / "report.md").read_text()
    assert "gloo connection reset" in report
    for collective in BUS_FACTORS:
        assert f"`{collective}`" in report
    assert format_bytes(MESSAGES[3]) in report


def test_index_collects_every_headline(tmp_path: Path) -> None:
    write_allreduce(allreduce_frame(), tmp_path / "allreduce_scaling")
    write_collectives(collectives_frame(), tmp_path / "collectives")
    readme = write_index(tmp_path).read_text()
    assert "(allreduce_scaling/report.md)" in readme
    assert "(collectives/report.md)" in readme
    # The target's row shows its median and its worst cell, with the cell's key.
    target = next(line for line in readme.splitlines() if "ring all-reduce busbw" in line)
    assert "0.80× over 3 cells" in target and "algorithm=ring" in target
    assert "not met in 3 of 3 cells" in target
    assert readme.count("| allreduce_scaling") >= 5


ALLREDUCE_FOLDER = Path(__file__).resolve().parents[1] / "bench/experiments/allreduce_scaling"
ALLREDUCE_REPORT_MODULES = ("report.py", "auto.py", "fits.py", "paired_rounds.py")


def test_allreduce_writer_reads_results_only():
    """The allreduce_scaling report's modules import no `impls` or torch, and importing the
    report loads neither (each algorithm's orders and place reach it as result columns)."""
    assert_source_imports_none(
        ALLREDUCE_FOLDER, ALLREDUCE_REPORT_MODULES, ("impls", "torch"), (".config", ".experiment")
    )
    assert_import_loads_none(
        "bench.experiments.allreduce_scaling.report", ("impls", "torch"), absent=("torch",)
    )
