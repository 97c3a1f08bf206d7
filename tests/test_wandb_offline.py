"""wandb in offline mode: one run per cell, one report run per grid, all on disk and local.

A failure here means the wandb record of a grid cannot be trusted or used as wandb's
users expect: a cell is not its own run (or lacks its key in the config, its group or
job type), a logged figure differs from results.csv, the results table turned numbers
into text, per-step lists are not curves against a step metric, the headline charts or
the report artifact are missing, an offline run tried to reach the network, wandb's
service process outlived the grid, or `wandb.mode=disabled` imported wandb at all.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from bench.experiments import experiments
from bench.results import ROW_CHECK, ResultStore
from bench.wandb_log import cell_name, draw_chart, table_columns
from tests.wandb_records import (
    first_of,
    logged_artifacts,
    logged_config,
    logged_history,
    logged_metrics,
    logged_summary,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
KEY = ("algorithm", "world_size", "message_bytes", "dtype")


class ConnectionTrap:
    """A local TCP listener standing in for every server: it records each connection."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.peers: list[tuple] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:  # closed
                return
            self.peers.append(peer)
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _offline_env(root: Path, url: str) -> dict[str, str]:
    """This environment with runs under `root` and every request, to wandb's API or
    anywhere else, sent to `url` (the trap) instead of the internet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        env.pop(proxy, None)
        env.pop(proxy.lower(), None)
    env |= {"WANDB_DIR": str(root), "WANDB_SILENT": "true", "WANDB_BASE_URL": url}
    return env | {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}


def _runs(root: Path) -> list[dict]:
    """Every offline run under `root`, in the order they started: its log, files folder
    and run record. (A folder's name holds its start to the second and then a random id:
    two runs started within one second would sort by the id.)"""
    found = []
    for folder in (root / "wandb").glob("offline-run-*"):
        (log,) = folder.glob("run-*.wandb")
        found.append({"log": log, "files": folder / "files", "run": first_of(log, "run")})
    return sorted(found, key=lambda r: (r["run"].start_time.seconds, r["run"].start_time.nanos))


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory, curves_process):
    """A two-cell grid run by the CLI with wandb offline (while `curves_process` runs)."""
    root = tmp_path_factory.mktemp("wandb")
    trap = ConnectionTrap()
    report_dir = root / "report"
    command = [
        *(sys.executable, "-m", "bench", "experiment=allreduce_scaling"),
        *("world_sizes=[2]", "algorithms=[ring,torch]", "message_bytes=[4096]"),
        *("repeats=1", "warmup=1", "window_s=0.005", "timeout_s=60"),
        *(f"report_dir={report_dir}", "wandb.mode=offline", f"hydra.run.dir={root / 'hydra'}"),
    ]
    env = _offline_env(root, f"http://127.0.0.1:{trap.port}")
    try:
        done = subprocess.run(
            command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180
        )
    finally:
        trap.close()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = _runs(root)
    return {
        "cells": [r for r in runs if r["run"].job_type == "allreduce_scaling"],
        "reports": [r for r in runs if r["run"].job_type == "allreduce_scaling-report"],
        "all": runs,
        "report_dir": report_dir,
        # Exact text, so floats compare as the very doubles that were written.
        "rows": pd.read_csv(report_dir / "results.csv", dtype=str, keep_default_na=False),
        "connections": trap.peers,
    }


def _cell_of(run: dict, rows: pd.DataFrame) -> pd.Series:
    config = logged_config(run["log"])
    match = rows[rows["algorithm"] == config["algorithm"]]
    assert len(match) == 1, config
    return match.iloc[0]


def test_offline_run_makes_no_connection(offline_run):
    assert offline_run["connections"] == []


def test_each_cell_is_a_run_grouped_by_the_experiment_run(offline_run):
    rows, cells = offline_run["rows"], offline_run["cells"]
    assert len(cells) == len(rows) == 2 and len(offline_run["reports"]) == 1
    assert len(offline_run["all"]) == 3  # nothing else was logged
    (grid_run_id,) = set(rows["run_id"])
    for run in offline_run["all"]:
        assert run["run"].run_group == grid_run_id
    for run in cells:
        row = _cell_of(run, rows)
        config = logged_config(run["log"])
        for column in KEY:  # the key, typed: world_size is a number, not "2"
            assert str(config[column]) == row[column], column
        assert isinstance(config["world_size"], int) and isinstance(config["message_bytes"], int)
        assert run["run"].display_name == cell_name({c: config[c] for c in KEY})
        # The experiment's config is there too, for grouping by any setting.
        assert config["experiment"] == "allreduce_scaling" and config["repeats"] == 1
        assert config["cluster"]["kind"] == "local"


def test_each_cell_run_summarises_its_row(offline_run):
    rows = offline_run["rows"]
    for run in offline_run["cells"]:
        row, summary = _cell_of(run, rows), logged_summary(run["log"])
        for column in ("time_s", "busbw_gbps", "algbw_gbps"):
            assert summary[column] == float(row[column]), (column, summary[column], row[column])
        assert summary["wrong"] == int(row["wrong"]) == 0
        assert (summary["status"], summary["error"]) == ("ok", "")
        assert first_of(run["log"], "exit").exit_code == 0
    ring = next(r for r in offline_run["cells"] if logged_config(r["log"])["algorithm"] == "ring")
    assert logged_summary(ring["log"])["max_rank_bytes_sent"] == 4096  # counted traffic too


def test_results_table_keeps_numbers_numeric(offline_run):
    (report,) = offline_run["reports"]
    rows = offline_run["rows"]
    final = logged_history(report["log"])[-1]
    table = json.loads((report["files"] / final["results/path"]).read_text())
    assert final["results/nrows"] == len(rows)
    # results.csv's row_check (a hash of the row's fields) stays in the file, out of wandb
    assert table["columns"] == [c for c in rows.columns if c != ROW_CHECK]
    logged = pd.DataFrame(table["data"], columns=table["columns"])
    for column in ("time_s", "busbw_gbps", "world_size", "message_bytes", "wrong"):
        assert all(isinstance(v, int | float) for v in logged[column]), column
    assert logged["time_s"].tolist() == [float(v) for v in rows["time_s"]]
    assert logged["world_size"].tolist() == [2, 2]
    assert logged["algorithm"].tolist() == rows["algorithm"].tolist()  # text stays text


def test_report_plots_and_headline_charts_are_logged(offline_run):
    (report,) = offline_run["reports"]
    final = logged_history(report["log"])[-1]
    plots = sorted(p.stem for p in offline_run["report_dir"].glob("*.png"))
    assert plots, "the report wrote no plot"
    for stem in plots:
        assert (report["files"] / final[f"plots/{stem}/path"]).exists()
    charts = experiments()["allreduce_scaling"].charts
    visualize = {
        key.removeprefix("_wandb/visualize/"): value["panel_config"]
        for key, value in logged_config(report["log"]).items()
        if key.startswith("_wandb/visualize/")
    }
    assert len(visualize) == len(charts) == 3
    for chart in charts:
        (panel,) = [p for p in visualize.values() if p["stringSettings"]["title"] == chart.title]
        assert panel["panelDefId"] == "wandb/scatter/v0"
        assert panel["fieldSettings"] == {"x": chart.x, "y": chart.y}


def test_headline_figures_are_in_the_report_summary(offline_run):
    (report,) = offline_run["reports"]
    headline = json.loads((offline_run["report_dir"] / "headline.json").read_text())
    summary = logged_summary(report["log"])
    scalars = {
        k: v
        for k, v in headline.items()
        if isinstance(v, int | float | str) and not isinstance(v, bool)
    }
    assert "wrong_total" in scalars and "failed_cells" in scalars
    for key, value in scalars.items():
        assert summary[f"headline/{key}"] == value, key
    # Every target's verdict, judged on its worst cell (this grid has none of its cells).
    for target in headline["targets"]:
        assert summary[f"targets/{target['figure']}/met"] is target["met"]
        assert summary[f"targets/{target['figure']}/cells"] == target["cells"]


def test_the_report_is_a_versioned_artifact(offline_run):
    (report,) = offline_run["reports"]
    artifact = logged_artifacts(report["log"])["allreduce_scaling-report"]
    assert artifact["type"] == "report"
    pngs = [p.name for p in offline_run["report_dir"].glob("*.png")]
    for name in ("report.md", "results.csv", "headline.json", *pngs):
        assert name in artifact["files"], name
    assert artifact["metadata"]["git_sha"] == offline_run["rows"]["git_sha"].iloc[0]
    assert artifact["metadata"]["rows"] == 2


# A logger fed rows of the committed gradient_compression results (per-step lists as
# the experiment stores them) and one failed cell; it prints this process's child
# processes while wandb runs and after `finish`.
CURVES = """
import json, os, sys, time
from pathlib import Path
from bench.experiments import experiments
from bench.results import ResultStore
from bench.wandb_log import WandbLogger

def children():
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid():
                found.append((stat.parent / "cmdline").read_text().replace("\\0", " "))
        except (OSError, IndexError):
            pass
    return found

experiment = experiments()["gradient_compression"]
store = ResultStore(sys.argv[1], experiment.key_columns, experiment.key_defaults)
rows = store.read().head(1).to_dict("records")
failed = {"method": "topk", "setting": "density=0.01", "seed": 1, "status": "failed",
          "error": "RankFailure: rank 1 crashed"}
logger = WandbLogger(mode="offline", project="distbench", experiment=experiment.name,
                     config={"experiment": experiment.name}, group="sweep-7",
                     key_columns=experiment.key_columns)
for row in [*rows, failed]:
    logger.log_row(row)
while not logger.run_dirs:
    time.sleep(0.05)
during = children()
logger.finish()
print(json.dumps({"during": during, "after": children()}))
"""


RESULTS = REPO_ROOT / "reports" / "gradient_compression"


@pytest.fixture(scope="module")
def curves_process(tmp_path_factory):
    """The CURVES logger, started at once so that it runs beside the CLI's grid."""
    root = tmp_path_factory.mktemp("curves")
    process = subprocess.Popen(
        [sys.executable, "-c", CURVES, str(RESULTS)],
        cwd=REPO_ROOT,
        env=_offline_env(root, "http://127.0.0.1:9"),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    yield root, process
    if process.poll() is None:
        process.kill()
        process.communicate()


@pytest.fixture(scope="module")
def curves_run(curves_process):
    root, process = curves_process
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-3000:]
    experiment = experiments()["gradient_compression"]
    store = ResultStore(RESULTS, experiment.key_columns, experiment.key_defaults)
    return {"runs": _runs(root), "row": store.read().iloc[0], **json.loads(stdout)}


def test_per_step_lists_are_curves_against_a_step_metric(curves_run):
    run, row = curves_run["runs"][0], curves_run["row"]
    metrics = logged_metrics(run["log"])
    for name in ("loss_curve", "eval_curve/loss", "eval_curve/accuracy", "eval_curve/train_s"):
        assert metrics[name] == "step", name
    history = logged_history(run["log"])
    losses = json.loads(row["loss_curve"])
    assert [h["loss_curve"] for h in history] == losses
    assert [h["step"] for h in history] == list(range(1, len(losses) + 1))
    evals = json.loads(row["eval_curve"])  # [[step, train s, held-out loss, accuracy]]
    logged = [(h["step"], h["eval_curve/accuracy"]) for h in history if "eval_curve/loss" in h]
    assert logged == [(step, accuracy) for step, _, _, accuracy in evals]
    summary = logged_summary(run["log"])
    assert summary["final_accuracy"] == row["final_accuracy"]
    assert "loss_curve" not in logged_config(run["log"])  # a curve, not a setting


def test_a_failed_cell_is_a_failed_run_with_its_error(curves_run):
    run = curves_run["runs"][1]
    summary, config = logged_summary(run["log"]), logged_config(run["log"])
    assert (summary["status"], summary["error"]) == ("failed", "RankFailure: rank 1 crashed")
    assert first_of(run["log"], "exit").exit_code != 0
    assert (config["method"], config["setting"], config["seed"]) == ("topk", "density=0.01", 1)
    assert run["run"].run_group == "sweep-7" and run["run"].job_type == "gradient_compression"


def test_no_wandb_process_outlives_finish(curves_run):
    assert any("wandb-core" in c for c in curves_run["during"]), curves_run["during"]
    assert curves_run["after"] == []


@pytest.mark.parametrize("name", sorted(experiments()))
def test_every_headline_chart_is_a_native_wandb_chart(name):
    """Each chart, drawn from the committed results, is wandb's own preset over the
    columns it names, with numbers on its value axis."""
    import wandb

    experiment = experiments()[name]
    results = REPO_ROOT / "reports" / name
    df = ResultStore(results, experiment.key_columns, experiment.key_defaults).read()
    assert experiment.charts, f"{name} declares no chart"
    for chart in experiment.charts:
        drawn = draw_chart(wandb, chart, df)
        assert drawn is not None, chart.title
        spec, table = drawn.spec, drawn.table
        assert spec.string_fields["title"] == chart.title
        if chart.kind == "line" and chart.group is not None:  # a series per group value
            assert spec.spec_name == "wandb/lineseries/v0"
            keys = {k for _, k, _ in table.data}
            groups = {str(g) for g in df.loc[df["status"] == "ok", chart.group].dropna()}
            assert keys and keys <= groups, (keys, groups)
            values = [v for _, _, v in table.data]
        else:
            preset = {"line": "line", "scatter": "scatter", "bar": "bar"}[chart.kind]
            assert spec.spec_name == f"wandb/{preset}/v0"
            field = "value" if chart.kind == "bar" else "y"
            assert spec.fields[field] == chart.y
            values = [r[table.columns.index(chart.y)] for r in table.data]
        assert values and all(isinstance(v, int | float) for v in values), chart.title


def test_table_columns_keep_types_and_encode_only_what_must_be():
    df = pd.DataFrame(
        {
            "n": [1, 2],
            "x": [0.5, float("nan")],
            "ok": [True, False],
            "name": ["a", None],
            "curve": [[1, 2], {"a": 1}],
        }
    )
    columns, rows = table_columns(df)
    assert columns == ["n", "x", "ok", "name", "curve"]
    assert rows == [[1, 0.5, True, "a", "[1, 2]"], [2, None, False, None, '{"a": 1}']]


def test_disabled_never_imports_wandb(tmp_path):
    probe = (
        "import sys, threading, pandas as pd\n"
        "from bench.wandb_log import WandbLogger\n"
        "logger = WandbLogger(mode='disabled', project='p', experiment='e', config={})\n"
        "logger.log_row({'a': 1, 'status': 'ok'})\n"
        f"logger.log_report(pd.DataFrame({{'a': [1]}}), {{}}, {str(tmp_path)!r})\n"
        "logger.finish()\n"
        "print('wandb' in sys.modules, threading.active_count())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "1"]
