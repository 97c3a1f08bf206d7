"""The saved wandb dashboard: one W&B report with a section per experiment and a panel per
headline figure (`Experiment.charts`), built with `wandb-workspaces`.

    python -m bench.dashboard                                  # offline: writes the spec
    python -m bench.dashboard mode=online entity=me experiments=[collectives,overlap]
    python -m bench.dashboard group=20261126T004055-21       # only that grid's runs

A report, not a workspace (a workspace has one run set for all its sections). Each
section holds two run sets: the per-cell runs (job type `<experiment>`) and the grids'
report runs (`<experiment>-report`, which carry the results table; `bench.wandb_log`),
of every grid logged to the project, or of one with `group=`.

Offline (the default) contacts no server: the report's JSON spec is written to `out`.
Online saves the report and prints its address. Chart to panel: `chart_panel`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.charts import Chart
from bench.wandb_log import RESULTS_TABLE

if TYPE_CHECKING:
    from bench.experiments import Experiment

__all__ = [
    "DashboardArgs",
    "build_report",
    "chart_panel",
    "experiment_blocks",
    "main",
    "parse_args",
    "report_spec",
]

MODES = ("offline", "online")
KEYS = ("entity", "project", "experiments", "group", "mode", "out")
DEFAULT_OUT = Path("outputs/dashboard.json")
"""Under the git-ignored outputs/: the spec carries random panel ids, so it is a build
artefact to inspect, not a file to commit beside the regenerated reports/."""


@dataclass(frozen=True, kw_only=True)
class DashboardArgs:
    """The command's settings; each refused with one line naming the key."""

    entity: str | None = None
    """The W&B entity that owns the report; required online (offline it only names it)."""
    project: str = "distbench"
    experiments: tuple[str, ...] = ()
    """Which experiments get a section, in this order; empty for all."""
    group: str | None = None
    """Only the runs of this wandb group (one grid's run id); every grid logged otherwise."""
    mode: str = "offline"
    out: Path = DEFAULT_OUT
    """Where offline mode writes the spec."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}; allowed values: {', '.join(MODES)}")
        if self.mode == "online" and not self.entity:
            raise ValueError("entity is required with mode=online (entity=<your W&B entity>)")
        if not self.project:
            raise ValueError("project must not be empty")
        if self.group is not None and ("'" in self.group or not self.group):
            raise ValueError(f"group={self.group!r}; expected a run group id (no quotes)")


def _parse_list(value: str) -> tuple[str, ...]:
    """`[a,b]`, `a,b` or `a` (Hydra's list syntax, as the bench command takes it)."""
    inner = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    return tuple(part.strip() for part in inner.split(",") if part.strip())


def parse_args(argv: Sequence[str]) -> DashboardArgs:
    """`key=value` arguments, as `python -m bench` takes them."""
    values: dict[str, Any] = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in KEYS:
            raise ValueError(f"unknown argument {arg!r}; allowed keys: {', '.join(KEYS)}")
        if key == "experiments":
            values[key] = _parse_list(value)
        elif key == "out":
            values[key] = Path(value)
        else:
            values[key] = value
    return DashboardArgs(**values)


def _selected(names: tuple[str, ...]) -> list[Experiment]:
    from bench.experiments import experiments

    found = experiments()
    unknown = [name for name in names if name not in found]
    if unknown:
        raise ValueError(
            f"experiments: unknown {', '.join(unknown)}; allowed values: {', '.join(found)}"
        )
    return [found[name] for name in names] if names else list(found.values())


def _run_column(name: str, experiment: Experiment) -> Any:
    """A numeric results column as a per-cell run holds it: a key column in the run's
    config, any other number in its summary."""
    import wandb_workspaces.reports.v2 as wr

    return wr.Config(name) if name in experiment.key_columns else wr.SummaryMetric(name)


def _table_chart(preset: str, fields: dict[str, str], title: str) -> Any:
    """wandb's own preset (what `wandb.plot.line`/`bar` log) over the report run's table."""
    import wandb_workspaces.reports.v2 as wr

    return wr.CustomChart(
        query={"summaryTable": {"tableKey": RESULTS_TABLE}},
        chart_name=preset,
        chart_fields=fields,
        chart_strings={"title": title},
    )


def chart_panel(chart: Chart, experiment: Experiment) -> Any:
    """The panel that draws `chart` from what the experiment's runs log.

    Each `Chart` becomes the panel wandb draws correctly from what is logged:
    - scatter: a native scatter plot over the per-cell runs (x and y from each run's config or
      summary, log axes kept); wandb cannot colour such points by a column, so the hover
      label names the chart's group instead;
    - line: a custom chart with wandb's own line preset over the report run's results table
      (logged with its real dtypes), one line per value of the group: the only panel that
      joins cells, which are separate runs, into a series;
    - bar: a native bar plot of the median y per x (the logger's own bar chart takes the
      median too) where x is a key column, in each cell run's config; else the bar preset
      over the results table.
    Where a run holds a column follows `bench.wandb_log`: the key and text columns in its
    config, numbers in its summary; a chart's group is categorical, so always config.
    """
    import wandb_workspaces.reports.v2 as wr

    if chart.kind == "scatter":
        legend = "${run:displayName}"
        if chart.group is not None:
            legend = f"{chart.group}=${{config:{chart.group}}} {legend}"
        return wr.ScatterPlot(
            title=chart.title,
            x=_run_column(chart.x, experiment),
            y=_run_column(chart.y, experiment),
            log_x=chart.log_x or None,
            log_y=chart.log_y or None,
            legend_template=legend,
        )
    if chart.kind == "bar" and chart.group is None and chart.x in experiment.key_columns:
        return wr.BarPlot(
            title=chart.title,
            metrics=[wr.SummaryMetric(chart.y)],
            orientation="v",
            groupby=wr.Config(chart.x),
            groupby_aggfunc="median",
            title_x=chart.x,
            title_y=chart.y,
        )
    if chart.kind == "bar":
        fields = {"label": chart.x, "value": chart.y}
        return _table_chart("wandb/bar/v0", fields, chart.title)
    fields = {"x": chart.x, "y": chart.y}
    if chart.group is not None:
        fields["stroke"] = chart.group
    scales = [axis for axis, log in (("x", chart.log_x), ("y", chart.log_y)) if log]
    # wandb's line preset has no log-scale setting: the title says what the lecture uses
    title = chart.title + (f" (log {' and '.join(scales)} in the report)" if scales else "")
    return _table_chart("wandb/line/v0", fields, title)


def _links(experiment: Experiment, args: DashboardArgs) -> str:
    """The markdown panel: the report artifact the report run logs (`bench.wandb_log`
    versions report.md, results.csv, headline.json and the plots as `<name>-report`),
    and the same files in the repository."""
    name = experiment.name
    artifact = f"{name}-report"
    if args.entity:
        url = f"https://wandb.ai/{args.entity}/{args.project}/artifacts/report/{artifact}/latest"
        artifact_line = f"- Report artifact: [{artifact}:latest]({url})"
    else:  # offline without an entity: the address is not known, the name is
        artifact_line = f"- Report artifact: `{artifact}:latest` (type `report`)"
    return "\n".join(
        [
            f"**{name}**: {experiment.summary}",
            "",
            artifact_line + " (report.md, results.csv, headline.json, plots).",
            f"- Results table: `{RESULTS_TABLE}` of the `{artifact}` run; every row is also in "
            f"`reports/{name}/results.csv`, the written report in `reports/{name}/report.md`.",
        ]
    )


def experiment_blocks(experiment: Experiment, args: DashboardArgs) -> list[Any]:
    """The experiment's section: a heading, its one-line summary and a panel grid."""
    import wandb_workspaces.reports.v2 as wr

    # No entity or project on a run set: the report's own project is used, and a run set
    # that names one makes wandb-workspaces look its id up on the server.
    grid = f" and Group = '{args.group}'" if args.group else ""
    runsets = [
        wr.Runset(name=f"{experiment.name} {part}", filters=f"JobType = '{job_type}'{grid}")
        for part, job_type in (("cells", experiment.name), ("report", f"{experiment.name}-report"))
    ]
    panels = [chart_panel(chart, experiment) for chart in experiment.charts]
    panels.append(wr.MarkdownPanel(markdown=_links(experiment, args)))
    return [
        wr.H1(experiment.name),
        wr.P(experiment.summary),
        wr.PanelGrid(runsets=runsets, panels=panels),
    ]


def build_report(args: DashboardArgs) -> Any:
    """The report object (`wandb_workspaces.reports.v2.Report`); nothing is sent."""
    import wandb_workspaces.reports.v2 as wr

    selected = _selected(args.experiments)
    blocks: list[Any] = [wr.TableOfContents()]
    for experiment in selected:
        blocks.extend(experiment_blocks(experiment, args))
    return wr.Report(
        project=args.project,
        entity=args.entity or "",  # a default would ask the server for the user's entity
        title="distbench: the lecture's figures",
        description="One section per experiment, one panel per headline figure "
        "(python -m bench.dashboard).",
        blocks=blocks,  # the default width: wandb-workspaces drops any other on loading
    )


def report_spec(report: Any) -> dict:
    """The report as the JSON the W&B server stores (its view spec, camelCase keys)."""
    return report._to_model().model_dump(mode="json", by_alias=True, exclude_none=True)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        report = build_report(args)
    except ValueError as error:
        print(f"bench.dashboard: {error}", file=sys.stderr)
        return 2
    if args.mode == "online":
        report.save()
        print(report.url)
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report_spec(report), indent=1) + "\n")
    print(f"wrote {args.out} (offline; mode=online entity=... saves it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
