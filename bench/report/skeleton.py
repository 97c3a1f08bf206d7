"""The report skeleton: everything every report has, written once.

An experiment declares its `Report`: a title, an intro, its targets and its own sections.
`write_report` then writes `report.md` as

    # title / intro
    ## Setup          the grid from the key columns, the host, the commit (once)
    ## Targets        every target judged on its worst cell (`bench.report.targets`)
    ## Correctness    cells checked against a reference in the same run (`wrong`)
    ## <sections>     the experiment's own: tables, plots, findings
    ## Failed cells   each failed cell's key and error

and `headline.json` with the same facts for the index and for CI; `Report` says what a section is.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench.report.format import (
    failures_list,
    format_bytes,
    host_cores,
    is_missing,
    markdown_table,
    ok_rows,
    run_context,
    to_jsonable,
    write_text_atomic,
)
from bench.report.plots import save_figure
from bench.report.targets import Target, canonical, key_text
from bench.results import with_row_check

__all__ = ["Context", "Report", "Section", "write_report"]

Section = Callable[["Context"], "str | None"]


@dataclass(frozen=True, kw_only=True)
class Report:
    """What one experiment's report is made of; `write_report` writes the rest.

    and `headline.json` with the same facts for the index and for CI. A section is a function
    `section(ctx) -> str | None`: the first line of its docstring is its heading and the rest
    its prose (edit the words without touching the logic); it returns the computed markdown
    below them, or None to leave the section out (no rows for it in this run). Through `ctx`
    it saves plots and adds index rows (`ctx.figure`), findings (`ctx.finding`) and headline
    fields (`ctx.headline`). Every number comes from the rows, or is theory labelled with its
    source.
    """

    title: str
    intro: str
    """Markdown: what the experiment measures and how to read it."""
    sections: Sequence[Section] = ()
    targets: Sequence[Target] = ()
    prepare: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    """Derives columns (e.g. a ratio a target reads) before targets and sections."""
    correctness: str = ""
    """What `wrong` counts in this experiment (prose shown under Correctness)."""
    persist: Sequence[str] = ()
    """Columns `prepare` derives from several rows (a baseline from another cell) that
    results.csv keeps too: rows are stored one cell at a time, before those exist."""


@dataclass(kw_only=True)
class Context:
    """What a section reads (the rows) and where it puts what it adds."""

    df: pd.DataFrame
    ok: pd.DataFrame
    report_dir: Path
    key_columns: list[str]
    settings: dict[str, Any] = field(default_factory=dict)
    headline: dict[str, Any] = field(default_factory=dict)
    figures: list[dict[str, str]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def cores(self) -> float:
        return host_cores(self.df)

    def crowded(self, world_size: float) -> bool:
        """Whether `world_size` ranks outnumbered this host's cores."""
        return math.isfinite(self.cores) and float(world_size) > self.cores

    def key(self, row: Mapping[str, Any]) -> str:
        return key_text(row, self.key_columns)

    def plot(self, fig: Any, name: str, alt: str) -> str:
        """Save `fig` as `<name>.png` beside the report; the markdown that shows it."""
        save_figure(fig, self.report_dir / f"{name}.png")
        return f"![{alt}]({name}.png)"

    def figure(
        self,
        figure: str,
        *,
        theory: str = "—",
        source: str = "—",
        measured: str = "—",
        model: str = "—",
        gap: str = "—",
    ) -> None:
        """An index row: a measured value (`measured`) or a model's output (`model`, never
        in the measured column) beside the lecture's or theory's value and its source."""
        self.figures.append(
            {
                "figure": figure,
                "theory": theory,
                "source": source,
                "measured": measured,
                "model": model,
                "gap": gap,
            }
        )

    def finding(self, claim: str, holds: bool, detail: str = "") -> None:
        """A claim the run checked; the index lists the ones that do not hold."""
        self.findings.append({"claim": claim, "holds": bool(holds), "detail": detail})


def _section_text(section: Section, ctx: Context) -> str | None:
    body = section(ctx)
    if body is None:
        return None
    doc = inspect.getdoc(section) or section.__name__
    heading, _, prose = doc.partition("\n")
    parts = [f"## {heading.strip()}"]
    if prose.strip():
        parts.append(prose.strip())
    if body.strip():
        parts.append(body.strip())
    return "\n\n".join(parts)


def _grid_text(ok: pd.DataFrame, key_columns: Sequence[str]) -> str:
    """Each key column with the values this run measured."""
    parts = []
    for column in key_columns:
        if column not in ok.columns:
            continue
        values = [v for v in pd.unique(ok[column]) if not pd.isna(v)]
        shown = [
            format_bytes(v) if column == "message_bytes" else canonical(v)
            for v in sorted(values, key=_sort_key)
        ]
        parts.append(f"`{column}` ∈ {{{', '.join(shown)}}}")
    return "; ".join(parts)


def _sort_key(value: Any) -> tuple:
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def _commits(df: pd.DataFrame) -> list[str]:
    if "git_sha" not in df.columns:
        return []
    return sorted({str(v) for v in df["git_sha"].dropna()})


def _setup(ctx: Context) -> str:
    df, ok = ctx.df, ctx.ok
    commits = _commits(df)
    lines = [
        f"{len(df)} cells, {len(ok)} ran. Grid: {_grid_text(ok, ctx.key_columns) or '—'}.",
        run_context(df),
    ]
    if len(commits) > 1:
        lines.append(
            f"**Mixed provenance:** the rows come from {len(commits)} commits "
            f"({', '.join(commits)}); a report should come from one."
        )
    hashes = _settings_hashes(df)
    if len(hashes) > 1:
        lines.append(
            f"**Mixed settings:** the rows were measured with {len(hashes)} sets of "
            f"settings (`settings_hash` {', '.join(hashes)})."
        )
    if "earlier" in df.columns and df["earlier"].any():
        earlier = df[df["earlier"].astype(bool)]
        cells = "; ".join(ctx.key(r) for _, r in earlier.iterrows())
        lines.append(
            f"**Earlier rows kept (`append=true`):** {len(earlier)} of the {len(df)} "
            f"cells come from earlier grids, not this run: {cells}."
        )
    if ctx.settings:
        settings = ", ".join(f"`{k}={_setting_text(v)}`" for k, v in ctx.settings.items())
        lines.append(f"Settings: {settings}.")
    return "## Setup\n\n" + "\n\n".join(lines)


def _settings_hashes(df: pd.DataFrame) -> list[str]:
    if "settings_hash" not in df.columns:
        return []
    return sorted({str(h) for h in df["settings_hash"] if not is_missing(h)})


def _setting_text(value: Any) -> str:
    return json.dumps(to_jsonable(value), ensure_ascii=False, separators=(",", ":"))


def _targets(verdicts: list) -> str | None:
    if not verdicts:
        return None
    table = pd.DataFrame(
        {
            "target": [v.target.figure for v in verdicts],
            "bound (source)": [f"{v.target.bound_text} ({v.target.source})" for v in verdicts],
            "median": [v.median_text for v in verdicts],
            "worst cell": [v.worst_text for v in verdicts],
            "verdict": [v.status for v in verdicts],
        }
    )
    return (
        "## Targets\n\nEach target is judged on every cell it applies to: it is met only if "
        "its worst cell meets it. Cells with more ranks than the host has cores are judged "
        "too, and labelled.\n\n" + markdown_table(table, numparse=False)
    )


def _correctness(ctx: Context, note: str) -> str:
    ok = ctx.ok
    parts = ["## Correctness"]
    if note:
        parts.append(note)
    if "wrong" not in ok.columns:
        parts.append("This experiment has no reference check (no `wrong` column).")
        return "\n\n".join(parts)
    wrong = pd.to_numeric(ok["wrong"], errors="coerce")
    bad = ok[(wrong != 0) | wrong.isna()]
    parts.append(
        f"Every cell that ran was checked against a reference in the same run: "
        f"{len(ok)} checked, **{len(bad)} wrong**."
    )
    if len(bad):
        table = pd.DataFrame(
            {"cell": [ctx.key(r) for _, r in bad.iterrows()], "wrong": bad["wrong"].tolist()}
        )
        parts.append(markdown_table(table, numparse=False))
    return "\n\n".join(parts)


def _failed(df: pd.DataFrame, key_columns: Sequence[str]) -> tuple[str, list[dict]]:
    failures = failures_list(df, key_columns)
    if not failures:
        return "## Failed cells (0)\n\nNo failed cells.", failures
    table = pd.DataFrame(
        {
            "cell": [key_text(f, key_columns) for f in failures],
            "error": [f["error"] for f in failures],
        }
    )
    return f"## Failed cells ({len(failures)})\n\n" + markdown_table(table), failures


def write_report(
    report: Report,
    df: pd.DataFrame,
    report_dir: Path,
    *,
    experiment: str,
    key_columns: Sequence[str],
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write `report.md`, the plots and `headline.json` for `df`; return the headline."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    if report.prepare is not None:
        df = report.prepare(df.copy())
        _persist(report.persist, df, report_dir / "results.csv", key_columns)
    ctx = Context(
        df=df,
        ok=ok_rows(df),
        report_dir=report_dir,
        key_columns=list(key_columns),
        settings=dict(settings or {}),
    )
    verdicts = [target.judge(ctx.ok, ctx.key_columns) for target in report.targets]
    if ctx.ok.empty:  # no cell ran: the rows hold their keys and errors, nothing measured
        sections = [
            "## Results\n\nNo cell ran, so there is nothing measured to show; the "
            "failed cells and their errors are listed below."
        ]
    else:
        sections = [t for s in report.sections if (t := _section_text(s, ctx)) is not None]
    failed_text, failures = _failed(df, ctx.key_columns)
    blocks = [
        f"# {report.title}",
        report.intro.strip(),
        _setup(ctx),
        _targets(verdicts),
        _correctness(ctx, report.correctness),
        *sections,
        failed_text,
    ]
    write_text_atomic(report_dir / "report.md", "\n\n".join(b for b in blocks if b) + "\n")
    headline = to_jsonable(_headline(ctx, experiment, report, verdicts, failures))
    write_text_atomic(
        report_dir / "headline.json", json.dumps(headline, indent=2, ensure_ascii=False) + "\n"
    )
    return headline


def _persist(columns: Sequence[str], df: pd.DataFrame, path: Path, keys: Sequence[str]) -> None:
    """Write `columns` of `df` into results.csv beside it, when it holds the same cells in
    the same order (the runner hands the report what it just read from there)."""
    if not columns or not path.exists():
        return
    stored = pd.read_csv(path, dtype=str, keep_default_na=False)
    same = len(stored) == len(df) and all(
        k in stored.columns and list(stored[k]) == [canonical(v) if v == v else "" for v in df[k]]
        for k in keys
    )
    if not same:
        return
    for column in columns:
        if column in df.columns:
            stored[column] = [
                ("" if v != v else repr(float(v)) if isinstance(v, float) else str(v))
                for v in df[column]
            ]
    write_text_atomic(path, with_row_check(stored).to_csv(index=False))


def _headline(ctx: Context, experiment: str, report: Report, verdicts, failures) -> dict:
    wrong = (
        pd.to_numeric(ctx.ok["wrong"], errors="coerce")
        if "wrong" in ctx.ok.columns
        else pd.Series(dtype=float)
    )
    commits = _commits(ctx.df)
    return {
        "experiment": experiment,
        "title": report.title,
        "git_sha": commits[0] if len(commits) == 1 else None,
        "commits": commits,
        "cells": len(ctx.df),
        "failed_cells": len(failures),
        "wrong_cells": int(((wrong != 0) | wrong.isna()).sum()),
        "wrong_total": int(wrong.sum()) if wrong.notna().all() else None,
        "targets": [v.as_dict() for v in verdicts],
        "figures": ctx.figures,
        "findings": ctx.findings,
        "failures": failures,
        "settings": ctx.settings,
        "settings_hash": _settings_hashes(ctx.df),
        "earlier_cells": int(ctx.df["earlier"].sum()) if "earlier" in ctx.df.columns else 0,
        **ctx.headline,
    }
