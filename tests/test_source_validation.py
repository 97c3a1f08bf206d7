"""planner_validation's sources are checked like inputs: a committed source report copied
and corrupted (a measured column dropped; NaN, -1, 0, inf or text in a finished row's
measurement) is refused in one line naming the file, the line and the column, before any
cell runs, and through the app as `bad config`, exit 2; an unmodified copy, and a failed
row with an empty measurement, are accepted. alpa_slicing checks the rows it shows."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.experiments.planner_validation import experiment, report
from bench.experiments.planner_validation.config import PlannerValidationConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
PAIR_KEYS = ["schedule", "stages", "microbatches", "virtual_stages"]


def _copy(tmp_path: Path, source: str) -> Path:
    path = tmp_path / source / "results.csv"
    path.parent.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "reports" / source / "results.csv", path)
    return path


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _zero_row(rows: list[dict[str, str]]) -> int:
    """The pandas index of a zero_memory row planner_validation reads as ground truth."""
    return next(
        i
        for i, r in enumerate(rows)
        if r["status"] == "ok" and r["impl"] == "distbench" and r["method"] == "zero2"
    )


def _ground_truth(root: Path, source: str = "zero_memory") -> list[dict]:
    return experiment.ground_truth(
        PlannerValidationConfig(reports_root=str(root), sources=[source])
    )


def test_unmodified_copy_is_accepted(tmp_path):
    _copy(tmp_path, "zero_memory")
    truths = _ground_truth(tmp_path)
    assert truths and all(t["measured_peak_bytes"] > 0 for t in truths)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("peak_bytes", "nan"),
        ("peak_bytes", "-1"),
        ("peak_bytes", "abc"),
        ("peak_bytes", ""),
        ("peak_bytes", "inf"),
        ("step_time_s", "0"),
        ("step_time_s", "-1"),
        ("step_time_s", "nan"),
    ],
)
def test_bad_measurement_is_refused_naming_file_line_column(tmp_path, column, value):
    path = _copy(tmp_path, "zero_memory")
    rows = _rows(path)
    i = _zero_row(rows)
    rows[i][column] = value
    _write(path, rows)
    with pytest.raises(ValueError) as caught:
        _ground_truth(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        f"{path}:{i + 2}: column {column} is {value!r}; a measurement must be a finite number > 0"
    )


def test_missing_column_is_refused_naming_file_and_header(tmp_path):
    path = _copy(tmp_path, "zero_memory")
    rows = [{k: v for k, v in r.items() if k != "peak_bytes"} for r in _rows(path)]
    _write(path, rows)
    with pytest.raises(
        ValueError, match=re.escape(f"{path}:1: the header has no peak_bytes column")
    ):
        _ground_truth(tmp_path)


def test_failed_row_with_empty_measurement_is_accepted(tmp_path):
    path = _copy(tmp_path, "zero_memory")
    rows = _rows(path)
    i = _zero_row(rows)
    rows[i].update(status="failed", peak_bytes="", step_time_s="")
    _write(path, rows)
    assert len(_ground_truth(tmp_path)) == len(_ground_truth_of_committed(tmp_path)) - 1


def _ground_truth_of_committed(tmp_path: Path) -> list[dict]:
    _copy(tmp_path / "committed", "zero_memory")
    return _ground_truth(tmp_path / "committed")


def test_pipeline_source_is_checked(tmp_path):
    path = _copy(tmp_path, "pipeline_utilization")
    rows = _rows(path)
    i = next(
        i
        for i, r in enumerate(rows)
        if r["status"] == "ok"
        and r["impl"] == "distbench"
        and r["slicing"] == "equal"
        and r["schedule"] == "1f1b"
    )
    rows[i]["replayed_makespan_s"] = "-1"
    _write(path, rows)
    with pytest.raises(
        ValueError, match=re.escape(f"{path}:{i + 2}: column replayed_makespan_s is '-1'")
    ):
        _ground_truth(tmp_path, "pipeline_utilization")


def test_alpa_slicing_checks_the_rows_it_shows(tmp_path):
    path = _copy(tmp_path, "pipeline_utilization")
    report._check_pairs(path, PAIR_KEYS)  # the committed rows pass
    rows = _rows(path)
    i = next(i for i, r in enumerate(rows) if r["status"] == "ok" and r["slicing"] == "alpa")
    rows[i]["step_time_s"] = "nan"
    _write(path, rows)
    with pytest.raises(ValueError, match=re.escape(f"{path}:{i + 2}: column step_time_s is 'nan'")):
        report._check_pairs(path, PAIR_KEYS)


def test_app_refuses_a_bad_source_as_bad_config_before_work(tmp_path):
    path = _copy(tmp_path / "reports", "zero_memory")
    rows = _rows(path)
    i = _zero_row(rows)
    rows[i]["peak_bytes"] = "nan"
    _write(path, rows)
    out = tmp_path / "out"
    argv = [
        "experiment=planner_validation",
        "profile=ci",
        "wandb.mode=disabled",
        f"reports_root={tmp_path / 'reports'}",
        "sources=[zero_memory]",
        f"report_dir={out}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "bench", *argv],
        cwd=REPO_ROOT,
        text=True,
        capture_output=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output
    assert f"bad config: {path}:{i + 2}: column peak_bytes is 'nan'" in output, output
    assert not (out / "results.csv").exists()
