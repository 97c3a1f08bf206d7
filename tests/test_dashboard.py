"""The saved dashboard (`bench.dashboard`), checked on the spec it writes offline.

A failure here means the dashboard would show an empty or wrong panel: an experiment with
no section or no figures, a panel naming a column its results never had (a typo, a renamed
column), a column read from the run's config that the logger puts in its summary, or a
spec the W&B server could not load back. It also pins the command's refusals.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pandas as pd
import pytest
from wandb_workspaces.reports.v2 import Report, internal

from bench import dashboard
from bench.experiments import experiments

REPORTS = Path(__file__).resolve().parents[1] / "reports"
NAMES = list(experiments())


@pytest.fixture(scope="module")
def spec() -> dict:
    return dashboard.report_spec(dashboard.build_report(dashboard.DashboardArgs()))


def section(spec: dict, name: str) -> dict:
    """The panel grid under the experiment's heading."""
    blocks = spec["spec"]["blocks"]
    headings = [
        i
        for i, b in enumerate(blocks)
        if b["type"] == "heading" and b["children"][0].get("text") == name
    ]
    assert len(headings) == 1, f"{name}: {len(headings)} headings"
    grids = [b for b in blocks[headings[0] :] if b["type"] == "panel-grid"]
    return grids[0]


def panels(grid: dict) -> list[dict]:
    return grid["metadata"]["panelBankSectionConfig"]["panels"]


def _name(metric: str) -> tuple[str, str]:
    """(where the run holds it, column) from a saved axis: `config:x.value`, `summary:x`,
    `summary_metrics.x`, or a bar's group-by `x.value`."""
    for prefix, where in (
        ("config:", "config"),
        ("summary:", "summary"),
        ("summary_metrics.", "summary"),
    ):
        if metric.startswith(prefix):
            return where, metric.removeprefix(prefix).removesuffix(".value")
    assert metric.endswith(".value"), metric
    return "config", metric.removesuffix(".value")


def panel_columns(panel: dict) -> dict[str, tuple[str, str]]:
    """What a saved panel reads, role -> (where: config, summary or table; column), read
    back from the spec's own format rather than from the objects that built it."""
    config = panel["config"]
    if panel["viewType"] == "Scatter Plot":
        found = {"x": _name(config["xAxis"]), "y": _name(config["yAxis"])}
        groups = re.findall(r"\$\{(config|summary):([^}]+)\}", config.get("legendTemplate", ""))
        if groups:
            found["group"] = groups[0]
        return found
    if panel["viewType"] == "Bar Chart":
        return {"x": _name(config["groupBy"]), "y": _name(config["metrics"][0])}
    assert panel["viewType"] == "Vega2", panel["viewType"]
    assert config["userQuery"]["queryFields"][0]["fields"][0]["args"][0]["value"] == "results"
    roles = {"x": "x", "label": "x", "y": "y", "value": "y", "stroke": "group"}
    return {roles[field]: ("table", column) for field, column in config["fieldSettings"].items()}


def chart_panels(spec: dict, name: str) -> list[dict]:
    return [p for p in panels(section(spec, name)) if p["viewType"] != "Markdown Panel"]


@pytest.mark.parametrize("name", NAMES)
def test_every_experiment_has_a_section_with_one_panel_per_chart(spec, name):
    charts = experiments()[name].charts
    assert charts, f"{name} has no charts: every experiment needs at least one"
    found = chart_panels(spec, name)
    assert len(found) == len(charts)
    titles = [
        p["config"].get("chartTitle") or p["config"]["stringSettings"]["title"] for p in found
    ]
    for title, chart in zip(titles, charts, strict=True):
        assert title.startswith(chart.title), (title, chart.title)
    markdown = [p for p in panels(section(spec, name)) if p["viewType"] == "Markdown Panel"]
    assert len(markdown) == 1 and f"`{name}-report:latest`" in markdown[0]["config"]["value"]


def where_logged(column: str, experiment, results: pd.DataFrame) -> str:
    """Where `bench.wandb_log` puts a column in a cell's run: the key and text columns in
    its config, numbers in its summary."""
    text = not pd.api.types.is_numeric_dtype(results[column])
    return "config" if column in experiment.key_columns or text else "summary"


@pytest.mark.parametrize("name", NAMES)
def test_every_panel_names_columns_the_results_have(spec, name):
    experiment = experiments()[name]
    header = set(pd.read_csv(REPORTS / name / "results.csv", nrows=0).columns)
    results = pd.read_csv(REPORTS / name / "results.csv")
    for chart, panel in zip(experiment.charts, chart_panels(spec, name), strict=True):
        read = panel_columns(panel)
        columns = {role: column for role, (_, column) in read.items()}
        assert set(columns.values()) <= header, f"{chart.title}: {set(columns.values()) - header}"
        assert columns == {"x": chart.x, "y": chart.y} | (
            {"group": chart.group} if chart.group else {}
        ), chart.title
        for role, (where, column) in read.items():
            if where != "table":
                expected = where_logged(column, experiment, results)
                assert where == expected, f"{chart.title}: {role}={column} read from {where}"


def run_filter(runset: dict, field: str) -> list[tuple[str, str]]:
    """A saved run set's filters on one run field, as (operator, value)."""
    return [
        (f["op"], f["value"]) for f in runset["filters"]["filters"] if f["key"]["name"] == field
    ]


@pytest.mark.parametrize("name", NAMES)
def test_each_section_shows_its_own_runs(spec, name):
    runsets = section(spec, name)["metadata"]["runSets"]
    job_types = [run_filter(runset, "jobType") for runset in runsets]
    assert job_types == [[("=", name)], [("=", f"{name}-report")]]
    assert [run_filter(runset, "group") for runset in runsets] == [[], []]


def test_group_narrows_every_run_set_to_one_grid():
    args = dashboard.DashboardArgs(experiments=("collectives", "overlap"), group="g-1")
    grids = [
        b
        for b in dashboard.report_spec(dashboard.build_report(args))["spec"]["blocks"]
        if b["type"] == "panel-grid"
    ]
    groups = [
        run_filter(runset, "group") for grid in grids for runset in grid["metadata"]["runSets"]
    ]
    assert groups == [[("=", "g-1")]] * 4


def test_the_spec_is_json_that_round_trips(spec):
    text = json.dumps(spec)
    assert json.loads(text) == spec
    model = internal.ReportViewspec.model_validate(json.loads(text))
    assert dashboard.report_spec(Report._from_model(model)) == spec


def test_offline_writes_the_spec_without_the_network(tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("offline dashboard opened a connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    out = tmp_path / "d" / "spec.json"
    assert dashboard.main(["experiments=[collectives,overlap]", f"out={out}"]) == 0
    written = json.loads(out.read_text())
    headings = [
        b["children"][0]["text"] for b in written["spec"]["blocks"] if b["type"] == "heading"
    ]
    assert headings == ["collectives", "overlap"]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["mode=offlne"], "mode='offlne'; allowed values: offline, online"),
        (["colour=red"], "allowed keys: entity, project, experiments, group, mode, out"),
        (["entity"], "unknown argument 'entity'"),
        (["experiments=[collectives,nope]"], "experiments: unknown nope; allowed values:"),
        (["mode=online"], "entity is required with mode=online"),
        (["project="], "project must not be empty"),
        (["group=a'b"], 'group="a\'b"; expected a run group id'),
    ],
)
def test_bad_arguments_give_one_clear_line(argv, named, capsys, monkeypatch):
    monkeypatch.setattr(Report, "save", lambda *a, **k: pytest.fail("saved despite refusal"))
    assert dashboard.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and named in captured.err, captured.err


def test_online_with_an_entity_saves(monkeypatch, capsys):
    saved = []
    monkeypatch.setattr(Report, "save", lambda self, **k: saved.append(self))
    monkeypatch.setattr(Report, "url", property(lambda self: "https://wandb.example/r"))
    argv = ["mode=online", "entity=someone", "project=p", "experiments=[collectives]"]
    assert dashboard.main(argv) == 0
    assert [(r.entity, r.project) for r in saved] == [("someone", "p")]
    markdown = [
        p
        for b in saved[0].blocks
        if hasattr(b, "panels")
        for p in b.panels
        if hasattr(p, "markdown")
    ]
    link = "https://wandb.ai/someone/p/artifacts/report/collectives-report/latest"
    assert [link in p.markdown for p in markdown] == [True]
