"""wandb logging organised the way wandb's users organise sweeps: one run per cell.

Each finished cell becomes a run: `group` is the experiment run (the grid's run id, or
the Hydra sweep's), `job_type` the experiment, `name` the cell's key, `config` the key
and the experiment's config, so wandb's runs table, grouping and parallel-coordinates
panels compare cells directly. Its scalar results, `status` and `error` are summary
metrics; its per-step lists (a loss curve, evaluations) are logged as real steps against
a `step` metric, so wandb draws them as curves. One more run per grid (`job_type`
`<experiment>-report`, same group) carries the results table with its real dtypes, the
experiment's headline charts (`Experiment.charts`) drawn natively from that table, the
report's plots, and the report itself as a versioned artifact.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import re
import threading
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from bench.charts import Chart

__all__ = ["RESULTS_TABLE", "WandbLogger", "cell_name", "draw_chart", "per_step", "table_columns"]

MODES = ("offline", "online", "disabled")
RESULTS_TABLE = "results"
"""The key the report run logs its results table under (`bench.dashboard` reads it)."""

log = logging.getLogger("bench")

PER_STEP_NAME = re.compile(r"curve|losses|step_times|_per_step$|_history$")
"""A text column whose JSON list is one value per step (a list value in a row always is)."""

RECORD_FIELDS = {"eval_curve": ("step", "train_s", "loss", "accuracy")}
"""Names for the fields of per-step records (`[[step, ...], ...]`), where a column's
layout is known; the first field is always the step. Others are numbered."""

# A cell's run is one of hundreds: no system-metrics sampler, console capture, git or
# code snapshot per run (the row already records the commit, host and versions).
LEAN_RUN = {
    "console": "off",
    "silent": True,  # not wandb's 15 lines of run summary and sync hint per cell on stderr
    "disable_git": True,
    "disable_code": True,
    "save_code": False,
    "disable_job_creation": True,
    "x_disable_stats": True,
    "x_disable_meta": True,
    "x_disable_machine_info": True,
    "x_save_requirements": False,
}

_STOP = object()


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def cell_name(key: dict[str, Any]) -> str:
    """A cell's key as a run name: `algorithm=ring world_size=2 message_bytes=4096`."""
    return " ".join(f"{k}={v}" for k, v in key.items() if v is not None)


def _as_list(column: str, value: Any) -> list | None:
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, str) and value.startswith("[") and PER_STEP_NAME.search(column):
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        return parsed if isinstance(parsed, list) else None
    return None


def per_step(row: dict[str, Any]) -> dict[int, dict[str, float]]:
    """The row's per-step values by step: `{step: {metric: value}}`, steps ascending.

    A list of numbers is one value per training step, the first at step 1. A list of
    records (`[[step, a, b], ...]`, as `eval_curve` holds) gives each field after the
    step its own metric, `<column>/<field>`, at the record's step.
    """
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for column, value in row.items():
        values = _as_list(column, value)
        if not values:
            continue
        if all(_number(v) for v in values):
            for step, v in enumerate(values, start=1):
                by_step[step][column] = v
        elif all(isinstance(r, list | tuple) and r and all(map(_number, r)) for r in values):
            width = max(len(r) for r in values)
            names = RECORD_FIELDS.get(column) or tuple(map(str, range(width)))
            for step, *fields in values:
                for name, v in zip(names[1:], fields, strict=False):
                    by_step[int(step)][f"{column}/{name}"] = v
    return dict(sorted(by_step.items()))


def _split_row(row: dict[str, Any], key_columns: Sequence[str]):
    """(config, summary) of a cell's row: numbers, flags, status and error are results;
    the key and the other text (implementation, layout, host, commit) describe the cell."""
    curves = {c for c, v in row.items() if _as_list(c, v) is not None}
    config: dict[str, Any] = {c: _plain(row[c]) for c in key_columns if c in row}
    error = row.get("error")
    summary = {"status": row.get("status"), "error": error if isinstance(error, str) else ""}
    for column, value in row.items():
        if column in config or column in summary or column in curves or value is None:
            continue
        if isinstance(value, bool) or (_number(value) and math.isfinite(value)):
            summary[column] = value
        elif isinstance(value, str):
            config[column] = value
    return config, summary


def _plain(value: Any) -> Any:
    """A table cell as JSON-ready Python: numpy scalars unwrapped, NaN as missing,
    lists and dicts as JSON text (a wandb table column holds one type)."""
    if hasattr(value, "item") and not isinstance(value, list | dict | str):
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, list | tuple | dict):
        return json.dumps(value)
    return value


def table_columns(df: pd.DataFrame) -> tuple[list[str], list[list[Any]]]:
    """The results as (columns, rows) with real types: a column whose values are all
    numbers (or flags) keeps them, any other column is text."""
    columns: dict[str, list[Any]] = {}
    for column in df.columns:
        values = [_plain(v) for v in df[column].tolist()]
        present = [v for v in values if v is not None]
        typed = all(_number(v) for v in present) or all(isinstance(v, bool) for v in present)
        columns[str(column)] = values if typed else [v if v is None else str(v) for v in values]
    return list(columns), [list(r) for r in zip(*columns.values(), strict=True)]


class WandbLogger:
    """Logs a grid's cells (one run each) and its report (one run) to wandb.

    Opening and closing a run costs wandb ~0.03 s (plus ~1 ms per logged step), seconds over
    a grid of hundreds of cheap cells: rows are queued and logged in order from one
    background thread, off the grid's critical path, and `finish` waits for the queue.
    Offline is the default (runs land in ./wandb for a later `wandb sync`); `disabled` never
    imports wandb.
    """

    def __init__(
        self,
        *,
        mode: str,
        project: str,
        experiment: str,
        config: dict,
        group: str | None = None,
        key_columns: Sequence[str] = (),
        charts: Sequence[Chart] = (),
        entity: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"wandb.mode={mode!r}; allowed values: {', '.join(MODES)}")
        self.mode, self.experiment, self.config = mode, experiment, config
        self.init = {"project": project, "entity": entity, "group": group, "mode": mode}
        self.key_columns, self.charts = tuple(key_columns), tuple(charts)
        self.run_dirs: list[Path] = []
        self.failures = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if mode != "disabled":
            self._thread = threading.Thread(target=self._drain, name="wandb-log", daemon=True)
            self._thread.start()

    @property
    def enabled(self) -> bool:
        return self._thread is not None

    def log_row(self, row: dict[str, Any]) -> None:
        """Queue a finished cell's row; its run is logged in the background."""
        if self.enabled:
            self._queue.put((self._log_cell, (dict(row),)))

    def log_report(self, df: pd.DataFrame, headline: dict, report_dir: Path) -> None:
        """Queue the grid's report run: table, charts, plots, summary and artifact."""
        if self.enabled:
            self._queue.put((self._log_report, (df.copy(), dict(headline), Path(report_dir))))

    def finish(self) -> None:
        """Wait for every queued run to be logged, then stop wandb's service process."""
        if not self.enabled:
            return
        self._queue.put(_STOP)
        self._thread.join()
        self._thread = None
        if self.failures:
            log.error("wandb: %d run(s) could not be logged (see above)", self.failures)

    def _drain(self) -> None:
        try:
            import wandb

            # The mode must be global, not only the runs': wandb's usage telemetry reads
            # the global settings and would otherwise post to the server from offline runs.
            wandb.setup(settings=wandb.Settings(mode=self.mode))
        except Exception:
            log.exception("wandb: could not start; nothing will be logged")
            self.failures += 1
            wandb = None
        while (item := self._queue.get()) is not _STOP:
            if wandb is None:
                continue
            method, args = item
            try:
                method(wandb, *args)
            except Exception:
                log.exception("wandb: %s failed", method.__name__)
                self.failures += 1
        if wandb is not None:
            wandb.teardown()

    def _start(self, wandb, **kwargs):
        run = wandb.init(**self.init, reinit="create_new", **kwargs)
        self.run_dirs.append(Path(run.dir).parent)
        return run

    def _log_cell(self, wandb, row: dict[str, Any]) -> None:
        config, summary = _split_row(row, self.key_columns)
        key = {c: _plain(row[c]) for c in self.key_columns if c in row}
        run = self._start(
            wandb,
            job_type=self.experiment,
            name=cell_name(key),
            config={**self.config, **config},
            settings=wandb.Settings(**LEAN_RUN),
        )
        try:
            steps = per_step(row)
            if steps:
                run.define_metric("step")
                for metric in sorted({m for values in steps.values() for m in values}):
                    run.define_metric(metric, step_metric="step")
                for step, values in steps.items():
                    run.log({"step": step, **values})
            run.summary.update(summary)
        finally:
            run.finish(exit_code=0 if row.get("status") == "ok" else 1)

    def _log_report(self, wandb, df: pd.DataFrame, headline: dict, report_dir: Path) -> None:
        run = self._start(
            wandb,
            job_type=f"{self.experiment}-report",
            name=f"{self.experiment} report",
            config=self.config,
        )
        try:
            columns, rows = table_columns(df)
            logged: dict[str, Any] = {RESULTS_TABLE: wandb.Table(columns=columns, data=rows)}
            for chart in self.charts:
                drawn = draw_chart(wandb, chart, df)
                if drawn is not None:
                    logged[f"charts/{_slug(chart.title)}"] = drawn
            for png in sorted(report_dir.glob("*.png")):
                logged[f"plots/{png.stem}"] = wandb.Image(str(png))
            run.log(logged)
            run.summary.update(_headline_summary(headline))
            run.log_artifact(_report_artifact(wandb, self.experiment, df, report_dir))
        finally:
            run.finish()


def _slug(title: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", title).strip("_").lower()


def draw_chart(wandb, chart: Chart, df: pd.DataFrame):
    """The chart as a wandb custom chart over the ok rows that have its columns (None if
    none do): a line per group value, a scatter of every point, or a bar per x value (the
    median where several rows share it)."""
    if any(c not in df.columns for c in chart.columns):
        log.warning("wandb: chart %r reads columns the results lack", chart.title)
        return None
    rows = df[df["status"] == "ok"] if "status" in df.columns else df
    rows = rows.assign(**{chart.y: pd.to_numeric(rows[chart.y], errors="coerce")})
    rows = rows.dropna(subset=list(chart.columns))
    if rows.empty:
        return None
    if chart.kind == "bar":
        bars = rows.groupby(chart.x, sort=False)[chart.y].median()
        data = [[str(label), float(value)] for label, value in bars.items()]
        table = wandb.Table(columns=[chart.x, chart.y], data=data)
        return wandb.plot.bar(table, chart.x, chart.y, title=chart.title)
    rows = rows.sort_values(chart.x)
    if chart.kind == "line" and chart.group is not None:
        series = list(rows.groupby(chart.group, sort=False))
        return wandb.plot.line_series(
            xs=[s[chart.x].tolist() for _, s in series],
            ys=[s[chart.y].tolist() for _, s in series],
            keys=[str(group) for group, _ in series],
            title=chart.title,
            xname=chart.x,
        )
    columns, data = table_columns(rows[list(chart.columns)])
    table = wandb.Table(columns=columns, data=data)
    draw = wandb.plot.line if chart.kind == "line" else wandb.plot.scatter
    return draw(table, chart.x, chart.y, title=chart.title)


def _headline_summary(headline: dict) -> dict[str, Any]:
    summary = {
        f"headline/{key}": value
        for key, value in headline.items()
        if isinstance(value, int | float | str) and not isinstance(value, bool)
    }
    for target in headline.get("targets", []):  # each judged on its worst cell
        for field in ("met", "cells", "median", "worst"):
            if target.get(field) is not None:
                summary[f"targets/{target['figure']}/{field}"] = target[field]
    return summary


def _report_artifact(wandb, experiment: str, df: pd.DataFrame, report_dir: Path):
    """The report's files as one versioned artifact; wandb makes a new version only when
    their contents change, so regenerating an unchanged report adds none."""
    shas = sorted({str(s) for s in df.get("git_sha", pd.Series(dtype=str)).dropna()})
    if not shas:
        from bench.provenance import git_sha

        shas = [git_sha()]
    artifact = wandb.Artifact(
        name=f"{experiment}-report",
        type="report",
        description=f"the {experiment} report: report.md, results.csv, headline and plots",
        metadata={"git_sha": shas[0] if len(shas) == 1 else shas, "rows": len(df)},
    )
    for pattern in ("report.md", "results.csv", "headline.json", "*.png"):
        for path in sorted(report_dir.glob(pattern)):
            artifact.add_file(str(path), name=path.name)
    if (report_dir / "traces").is_dir():
        artifact.add_dir(str(report_dir / "traces"), name="traces")
    return artifact
