"""Checks of each experiment's CI-profile report against theory or its targets.

`tests/test_reports_ci.py` regenerates every report with `profile=ci` and runs the
`CHECKS` of `tests/ci_checks/<experiment>.py` on it (`check(df, headline)` raises
AssertionError when the report does not support its figures). It also feeds each check a
copy of the report whose measured figures are all zero, and one whose figures are all
NaN, and requires every check to fail on both: a check that passes on such a report
proves nothing. `ARTEFACTS` lists the plots the report must write.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["ran", "rows"]


def ran(df: pd.DataFrame) -> pd.DataFrame:
    """The rows whose cells ran; fails if any cell failed or none ran."""
    failed = df[df["status"] != "ok"]
    assert failed.empty, failed["error"].tolist()
    assert len(df), "no cell ran"
    return df


def rows(df: pd.DataFrame, **where: object) -> pd.DataFrame:
    """The rows matching every column == value; fails if there is none."""
    hit = df
    for column, value in where.items():
        hit = hit[hit[column] == value]
    assert len(hit), f"no row with {where}"
    return hit
