"""The runner under faults: cells whose ranks raise, crash or hang, interruption and resume.

A failure here means a grid cannot be left to run unattended: one bad cell would stop the
grid or be recorded as a success, its error would be lost, rank processes would outlive
the run, an interrupted grid would lose finished cells, or `resume=true` would measure
finished cells again (or skip unfinished ones).
"""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bench.config import WandbConfig
from bench.results import ResultStore, settings_hash
from bench.runner import Grid, measured_settings, run_experiment
from tests.runner_cells import (
    LOCAL,
    FakeConfig,
    fake_experiment,
    is_running,
    rank_descendants,
    rank_pids,
    wait_until,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
# Also the ranks' process-group timeout: long enough for two ranks that start unevenly on a
# loaded host to meet, short enough that the hanging cell costs little.
TIMEOUT_S = 5.0


def run_grid(
    report_dir: Path, marker_dir: Path, cells: list[str], *, resume: bool = False, **options
):
    marker_dir.mkdir(parents=True, exist_ok=True)
    cfg = FakeConfig(cells=cells, marker_dir=str(marker_dir), timeout_s=TIMEOUT_S)
    return run_experiment(
        fake_experiment(),
        cfg,
        report_dir=report_dir,
        cluster=LOCAL,
        resume=resume,
        wandb_cfg=WandbConfig(mode="disabled"),
        **options,
    )


# --- one grid with every kind of fault, between cells that succeed ------------------------

FAULT_GRID = ["ok1:ok", "raise:raise", "ok2:ok", "exit:exit", "ok3:ok", "hang:hang", "ok4:ok"]


@pytest.fixture(scope="module")
def fault_grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    # Other tests' pools (the session's ranks8) may be alive: only new processes count.
    before = set(rank_descendants()) | {p.pid for p in multiprocessing.active_children()}
    started = time.monotonic()
    df = run_grid(root / "report", root / "markers", FAULT_GRID)
    return {
        "df": df,
        "rows": df.set_index("cell"),
        "report_dir": root / "report",
        "markers": root / "markers",
        "seconds": time.monotonic() - started,
        "pids_before": before,
    }


def test_every_cell_has_one_row_in_grid_order(fault_grid):
    assert list(fault_grid["df"]["cell"]) == [spec.split(":")[0] for spec in FAULT_GRID]
    on_disk = ResultStore(fault_grid["report_dir"], ["cell"]).read()
    pd.testing.assert_frame_equal(on_disk, fault_grid["df"])


def test_cells_around_faults_still_succeed(fault_grid):
    rows = fault_grid["rows"]
    for cell in ["ok1", "ok2", "ok3", "ok4"]:
        assert rows.loc[cell, "status"] == "ok", rows.loc[cell, "error"]
        assert pd.isna(rows.loc[cell, "error"])
        assert len(rows.loc[cell, "pids"].split()) == 2  # both ranks returned a value


@pytest.mark.parametrize(
    "cell, needles",
    [
        ("raise", ["rank 1", "ValueError", "cell raise refuses to run on rank 1"]),
        ("exit", ["rank 1", "exited with code 7"]),
        ("hang", ["rank 0", "rank 1", f"timed out after {TIMEOUT_S:g} s"]),
    ],
)
def test_faulty_cell_is_failed_row_naming_its_error(fault_grid, cell, needles):
    row = fault_grid["rows"].loc[cell]
    assert row["status"] == "failed"
    for needle in needles:
        assert needle in row["error"], row["error"]
    # A failed row still says where it was measured, and carries no made-up measurement.
    assert row["backend"] == "gloo" and row["world_size"] == 2
    assert pd.isna(row["pids"])


def test_hanging_cell_is_cut_at_its_timeout(fault_grid):
    # Three fresh pools after the failures plus one hang of TIMEOUT_S: well under a minute;
    # a hang that is not cut would sleep for 600 s.
    assert fault_grid["seconds"] < 60


def test_no_rank_outlives_the_grid(fault_grid):
    pids = rank_pids(fault_grid["markers"])
    # Every cell, the faulty ones included, started on both ranks.
    assert len(pids) == 2 * len(FAULT_GRID)
    assert not [name for name, pid in pids.items() if is_running(pid)]
    before = fault_grid["pids_before"]
    assert [p for p in multiprocessing.active_children() if p.pid not in before] == []
    assert {pid: cmd for pid, cmd in rank_descendants().items() if pid not in before} == {}


# --- interruption and resume ---------------------------------------------------------------


def test_interrupted_grid_keeps_finished_cells_and_resume_runs_only_the_rest(tmp_path):
    report_dir, markers = tmp_path / "report", tmp_path / "markers"
    markers.mkdir()
    # A separate runner process, killed without warning while its third cell hangs.
    grid = subprocess.Popen(
        [sys.executable, "-m", "tests.runner_cells", str(report_dir), str(markers), "60"]
        + ["a:ok", "b:ok", "c:hang"],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: len(rank_pids(markers)) == 6, 60, "cell c to start on both ranks")
    finally:
        grid.send_signal(signal.SIGKILL)
        grid.wait(10)
    pids = rank_pids(markers)
    # Ranks watch their parent and leave once it is gone, even when it could not clean up.
    wait_until(lambda: not any(map(is_running, pids.values())), 10, "orphaned ranks to exit")

    store = ResultStore(report_dir, ["cell"])
    assert store.finished_keys() == {("a",), ("b",)}
    assert list(store.read()["cell"]) == ["a", "b"]
    assert not list(report_dir.glob(".results.*.tmp"))

    again = tmp_path / "markers-resume"
    df = run_grid(report_dir, again, ["a:ok", "b:ok", "c:ok"], resume=True)
    assert sorted(rank_pids(again)) == ["c.rank0", "c.rank1"]
    assert list(df["cell"]) == ["a", "b", "c"] and set(df["status"]) == {"ok"}


def fake_settings_hash() -> str:
    """The settings hash a `run_grid` row carries (marker_dir and timeout_s change no
    measurement, so any values do)."""
    cfg = FakeConfig(cells=[], marker_dir="anywhere", timeout_s=1.0)
    return settings_hash(measured_settings(fake_experiment(), cfg, LOCAL))


def test_resume_reruns_failed_and_missing_cells_and_no_resume_reruns_all(tmp_path):
    report_dir = tmp_path / "report"
    grid = ["a:ok", "b:ok", "c:ok"]
    # As if a grid had finished a, failed b and been stopped before c; d is a finished
    # cell of the same settings but another grid, e one of this grid with other settings.
    same = fake_settings_hash()
    ResultStore(report_dir, ["cell"]).write(
        [
            {"cell": "a", "pids": "101 102", "status": "ok", "error": "", "settings_hash": same},
            {
                "cell": "b",
                "status": "failed",
                "error": "rank 1: exited with code 9",
                "settings_hash": same,
            },
            {"cell": "d", "pids": "1 2", "status": "ok", "error": "", "settings_hash": same},
        ]
    )

    resumed = run_grid(report_dir, tmp_path / "m1", grid, resume=True)
    assert sorted(rank_pids(tmp_path / "m1")) == ["b.rank0", "b.rank1", "c.rank0", "c.rank1"]
    assert list(resumed["cell"]) == ["a", "b", "c"] and set(resumed["status"]) == {"ok"}
    assert resumed.set_index("cell").loc["a", "pids"] == "101 102"  # kept, not measured again
    # d is not of this grid: gone from results.csv (no append), so not in the report either.
    assert list(ResultStore(report_dir, ["cell"]).read()["cell"]) == ["a", "b", "c"]

    rerun = run_grid(report_dir, tmp_path / "m2", grid, resume=False)
    assert len(rank_pids(tmp_path / "m2")) == 6
    assert list(rerun["cell"]) == ["a", "b", "c"] and set(rerun["status"]) == {"ok"}
    assert rerun.set_index("cell").loc["a", "pids"] != "101 102"


def test_two_runs_of_one_process_in_one_second_have_their_own_ids():
    """A run keeps the stored rows whose run_id is its own: two runs sharing an id (one
    process, one second: the id was its time and pid) made a rerun keep the first's rows."""
    cfg = FakeConfig(cells=["a:ok"], marker_dir="anywhere", timeout_s=1.0)
    ids = {Grid.of(fake_experiment(), cfg, LOCAL, None).run_id for _ in range(3)}
    assert len(ids) == 3
    assert Grid.of(fake_experiment(), cfg, LOCAL, "sweep-7").run_id == "sweep-7"


def test_append_keeps_earlier_grids_and_the_report_names_them(tmp_path):
    report_dir = tmp_path / "report"
    run_grid(report_dir, tmp_path / "m1", ["a:ok", "b:ok"])
    df = run_grid(report_dir, tmp_path / "m2", ["c:ok"], append=True)
    assert list(df["cell"]) == ["c"]  # what the caller counts: the grid just run
    assert list(ResultStore(report_dir, ["cell"]).read()["cell"]) == ["a", "b", "c"]
    report = (report_dir / "report.md").read_text()
    assert "**Earlier rows kept (`append=true`):** 2 of the 3 cells" in report
    assert "cell=a; cell=b" in report

    df = run_grid(report_dir, tmp_path / "m3", ["c:ok"])  # without append: c alone
    assert list(ResultStore(report_dir, ["cell"]).read()["cell"]) == ["c"]
    assert "Earlier rows" not in (report_dir / "report.md").read_text()


def test_jobs_of_one_sweep_share_report_dir_and_rows(tmp_path):
    report_dir = tmp_path / "report"
    run_grid(report_dir, tmp_path / "m0", ["old:ok"])  # an earlier grid
    run_grid(report_dir, tmp_path / "m1", ["a:ok"], sweep="sweep-1")
    run_grid(report_dir, tmp_path / "m2", ["b:ok"], sweep="sweep-1")
    assert list(ResultStore(report_dir, ["cell"]).read()["cell"]) == ["a", "b"]


def test_host_probe_brackets_each_cell_when_the_experiment_asks(tmp_path, monkeypatch):
    """An experiment with `host_probe` gets, per row, the probes timed just before and just
    after its cell (the after-probe of one cell is the before-probe of the next) and their
    mean; an experiment without it records none and times no probe."""
    import dataclasses

    import bench.kit.host

    ticks = iter(range(1, 100))
    monkeypatch.setattr(bench.kit.host, "host_probe", lambda: float(next(ticks)))
    cfg = FakeConfig(
        cells=["a:ok", "b:ok", "c:raise"], marker_dir=str(tmp_path / "m"), timeout_s=TIMEOUT_S
    )
    (tmp_path / "m").mkdir()
    probed = dataclasses.replace(fake_experiment(), host_probe=True)
    df = run_experiment(
        probed,
        cfg,
        report_dir=tmp_path / "probed",
        cluster=LOCAL,
        resume=False,
        wandb_cfg=WandbConfig(mode="disabled"),
    ).set_index("cell")
    assert list(df["host_probe_before_s"]) == [1.0, 2.0, 3.0]
    assert list(df["host_probe_after_s"]) == [2.0, 3.0, 4.0]
    assert list(df["host_probe_s"]) == [1.5, 2.5, 3.5]
    assert df.loc["c", "status"] == "failed"  # a failed cell is bracketed all the same
    plain = run_experiment(
        fake_experiment(),
        cfg,
        report_dir=tmp_path / "plain",
        cluster=LOCAL,
        resume=False,
        wandb_cfg=WandbConfig(mode="disabled"),
    )
    assert "host_probe_s" not in plain.columns
    assert next(ticks) == 5  # the plain grid timed no probe
