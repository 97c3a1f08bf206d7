"""`make reports` with profile=ci, regenerated into a temporary directory, checked against
theory and targets: this is how CI regenerates the reports.

Each experiment's checks live in `tests/ci_checks/<experiment>.py` (`CHECKS`). A failure
means a committed report could show a figure its run did not support: a collective that
returned wrong data, traffic that differs from the algorithm's analytic count, a growth
order that contradicts the lecture, a target missed, a missing artefact. And since a check
that cannot fail proves nothing, every check must fail on the same report with its
measured figures all zero, and all NaN."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.experiments import experiments
from bench.report.format import METADATA_COLUMNS
from bench.results import read_results

REPO = Path(__file__).resolve().parent.parent
NAMES = sorted(experiments())
KEEP = {*METADATA_COLUMNS, "world_size", "timestamp", "status", "error", "python_version"}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reports")
    cmd = [sys.executable, "-m", "bench.make_reports", "--profile", "ci", "--out", str(out)]
    # ~7 minutes on a quiet 2-core host; the limit leaves room for a slower CI machine.
    proc = subprocess.run(
        [*cmd, "wandb.mode=disabled"], cwd=REPO, capture_output=True, text=True, timeout=1500
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def load(reports: Path, name: str) -> tuple[pd.DataFrame, dict]:
    # As the reports read it: a commit's short sha stays text even when it is all digits
    # (2411369) or reads as a float (1234e56).
    df = read_results(reports / name / "results.csv")
    headline = json.loads((reports / name / "headline.json").read_text())
    return df, headline


def test_load_keeps_a_commit_sha_of_digits_as_text(tmp_path):
    """The committed reports were once made at 2411369: read as a number, planner_validation's
    check that each row names its source's commit failed on a sha it did carry."""
    (tmp_path / "x").mkdir()
    pd.DataFrame({"git_sha": ["2411369"], "source_git_sha": ["0123e45"], "time_s": [1.5]}).to_csv(
        tmp_path / "x" / "results.csv", index=False
    )
    (tmp_path / "x" / "headline.json").write_text("{}")
    df, _ = load(tmp_path, "x")
    assert df["git_sha"].iloc[0] == "2411369" and df["source_git_sha"].iloc[0] == "0123e45"
    assert df["time_s"].iloc[0] == 1.5


def checks_of(name: str):
    try:
        return importlib.import_module(f"tests.ci_checks.{name}")
    except ModuleNotFoundError:
        return None


def degenerate(df: pd.DataFrame, key_columns, fill: float) -> pd.DataFrame:
    """`df` with every measured number replaced by `fill`: keys and metadata kept."""
    out = df.copy()
    keep = set(key_columns) | KEEP
    for column in out.columns:
        if column not in keep and pd.api.types.is_numeric_dtype(out[column]):
            out[column] = fill
    return out


@pytest.mark.parametrize("name", NAMES)
def test_report_artefacts_are_written(reports, name):
    module = checks_of(name)
    for artefact in [
        "report.md",
        "results.csv",
        "headline.json",
        *(f"{p}.png" for p in module.ARTEFACTS),
    ]:
        assert (reports / name / artefact).stat().st_size > 0, f"{name}/{artefact}"
    assert f"[{name}]({name}/report.md)" in (reports / "README.md").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_report_passes_its_checks(reports, name):
    df, headline = load(reports, name)
    for check in checks_of(name).CHECKS:
        check(df, headline)


@pytest.mark.parametrize("fill", [0.0, np.nan], ids=["zero", "nan"])
@pytest.mark.parametrize("name", NAMES)
def test_every_check_fails_on_degenerate_figures(reports, name, fill, tmp_path):
    experiment = experiments()[name]
    df = degenerate(load(reports, name)[0], experiment.key_columns, fill)
    headline = experiment.report_on(df, tmp_path, None)
    passed = []
    for check in checks_of(name).CHECKS:
        try:
            check(df, headline)
        except AssertionError:
            continue
        passed.append(check.__name__)
    assert not passed, f"checks that pass on all-{fill} figures: {passed}"


def test_every_experiment_has_ci_checks():
    missing = [name for name in NAMES if checks_of(name) is None]
    assert not missing, f"no tests/ci_checks/<name>.py for {missing}"


def test_index_shows_every_target_by_its_worst_cell(reports):
    """Each report's targets reach reports/README.md with their median, their worst cell
    and that cell's key, and the verdict — never the median alone."""
    index = (reports / "README.md").read_text()
    for name in NAMES:
        for target in load(reports, name)[1]["targets"]:
            figure, worst = (target[k].replace("|", "\\|") for k in ("figure", "worst_text"))
            line = next((x for x in index.splitlines() if figure in x), None)
            assert line is not None, (name, figure)
            assert worst in line and target["status"] in line, line


@pytest.mark.parametrize("name", NAMES)
def test_report_survives_an_all_failed_grid(reports, name, tmp_path):
    """Every cell failed, rows holding only their keys and metadata: the report is still
    written, lists every failure, and meets no target."""
    experiment = experiments()[name]
    df = load(reports, name)[0]
    kept = [c for c in df.columns if c in set(experiment.key_columns) | KEEP]
    failed = df[kept].assign(status="failed", error="RuntimeError: no rank started")
    headline = experiment.report_on(failed, tmp_path, None)
    assert headline["failed_cells"] == len(df) and headline["cells"] == len(df)
    assert "no rank started" in (tmp_path / "report.md").read_text()
    assert not any(target["met"] for target in headline["targets"])
