"""wandb in offline mode: what a run logs lands on disk, equals results.csv, and stays local.

A failure here means the wandb record of a run cannot be trusted or is incomplete: a
cell's logged time or bus bandwidth differs from the row in results.csv, the results
table, plots, config or headline figures are missing from the run, or an offline run
tried to reach the network.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from tests.wandb_records import logged_config, logged_history, logged_summary

REPO_ROOT = Path(__file__).resolve().parents[1]


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


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("wandb")
    trap = ConnectionTrap()
    url = f"http://127.0.0.1:{trap.port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        env.pop(proxy, None)
        env.pop(proxy.lower(), None)
    # Any request, to wandb's API or anywhere else, ends at the trap instead of the internet.
    env |= {"WANDB_DIR": str(root), "WANDB_SILENT": "true", "WANDB_BASE_URL": url}
    env |= {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
    report_dir = root / "report"
    command = [
        *(sys.executable, "-m", "bench", "experiment=allreduce_scaling"),
        *("world_sizes=[2]", "algorithms=[ring,torch]", "message_bytes=[4096]"),
        *("repeats=1", "warmup=1", "window_s=0.005", "timeout_s=60"),
        *(f"report_dir={report_dir}", "wandb.mode=offline", f"hydra.run.dir={root / 'hydra'}"),
    ]
    try:
        done = subprocess.run(
            command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180
        )
    finally:
        trap.close()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = list((root / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    (log,) = runs[0].glob("run-*.wandb")
    return {
        "log": log,
        "files": runs[0] / "files",
        "report_dir": report_dir,
        # Exact text, so floats compare as the very doubles that were written.
        "rows": pd.read_csv(report_dir / "results.csv", dtype=str, keep_default_na=False),
        "connections": trap.peers,
    }


def test_offline_run_makes_no_connection(offline_run):
    assert offline_run["connections"] == []


def test_each_cell_is_logged_with_the_values_of_its_row(offline_run):
    rows = offline_run["rows"]
    steps = [s for s in logged_history(offline_run["log"]) if "time_s" in s]
    assert len(steps) == len(rows) == 2
    # Cells are logged as they finish, in the order results.csv records them.
    for step, (_, row) in zip(steps, rows.iterrows(), strict=True):
        for column in ("time_s", "busbw_gbps", "algbw_gbps"):
            assert step[column] == float(row[column]), (column, step[column], row[column])
        assert step["wrong"] == int(row["wrong"]) == 0
        assert step["world_size"] == int(row["world_size"])
        assert step["ok"] == 1
    ring = steps[rows.index[rows["algorithm"] == "ring"][0]]
    assert ring["max_rank_bytes_sent"] == 4096  # counted traffic is logged too


def test_results_table_and_plots_are_logged(offline_run):
    final = logged_history(offline_run["log"])[-1]
    table = pd.read_json(offline_run["files"] / final["results/path"], orient="split")
    assert final["results/nrows"] == len(offline_run["rows"])
    assert list(table.columns) == list(offline_run["rows"].columns)
    assert table["time_s"].astype(str).tolist() == offline_run["rows"]["time_s"].tolist()
    plots = sorted(p.stem for p in offline_run["report_dir"].glob("*.png"))
    assert plots, "the report wrote no plot"
    for stem in plots:
        assert (offline_run["files"] / final[f"plots/{stem}/path"]).exists()


def test_headline_figures_are_in_the_summary(offline_run):
    import json

    headline = json.loads((offline_run["report_dir"] / "headline.json").read_text())
    summary = logged_summary(offline_run["log"])
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
    # The summary also holds the last cell's metrics, as wandb does for every logged key.
    assert summary["time_s"] == float(offline_run["rows"]["time_s"].iloc[-1])


def test_config_names_the_experiment_grid_and_cluster(offline_run):
    config = logged_config(offline_run["log"])
    assert config["experiment"] == "allreduce_scaling"
    assert config["algorithms"] == ["ring", "torch"]
    assert config["world_sizes"] == [2] and config["message_bytes"] == [4096]
    assert config["cluster"]["kind"] == "local"
