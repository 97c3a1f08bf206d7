"""`cluster=slurm` through Hydra's submitit launcher, run here with its local executor.

A failure here means the SLURM path is broken where no cluster is needed to see it:
`cluster=slurm` does not compose with the launcher, a job of one task does not spawn
its ranks, a job of several tasks does not make each task one rank of one process group,
or concurrent jobs of one sweep lose each other's rows in results.csv.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_GRID = [
    "experiment=allreduce_scaling",
    "world_sizes=[2]",
    "message_bytes=[4096]",
    "repeats=1",
    "warmup=1",
    "window_s=0.005",
    "timeout_s=60",
    "wandb.mode=disabled",
]


def sweep(tmp_path: Path, *overrides: str) -> tuple[pd.DataFrame, list[Path]]:
    """Run a submitit_local multirun; return results.csv and the jobs' stdout logs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["WANDB_MODE"] = "disabled"
    command = [
        *(sys.executable, "-m", "bench", "-m", *TINY_GRID),
        *("cluster=slurm", "hydra/launcher=submitit_local"),
        *(f"report_dir={tmp_path / 'report'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"),
        *overrides,
    ]
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    logs = sorted((tmp_path / "sweep" / ".submitit").glob("*/*_log.*"))
    detail = done.stdout[-3000:] + done.stderr[-3000:]
    detail += "".join(f"\n--- {p.name} ---\n{p.read_text()[-2000:]}" for p in logs)
    assert done.returncode == 0, detail
    assert (tmp_path / "report" / "results.csv").exists(), detail
    return pd.read_csv(tmp_path / "report" / "results.csv"), logs


def check_rows(df: pd.DataFrame) -> None:
    assert sorted(df["algorithm"]) == ["ring", "torch"]
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert (df["wrong"] == 0).all()
    assert (df["backend"] == "gloo").all() and (df["world_size"] == 2).all()


def test_sweep_of_single_task_jobs_spawns_ranks_and_shares_results(tmp_path):
    # Two jobs at once, one algorithm each; each job spawns its 2 ranks like cluster=local,
    # and both write the same results.csv (the store's lock keeps both rows).
    df, logs = sweep(tmp_path, "algorithms=[ring],[torch]")
    check_rows(df)
    outs = [p for p in logs if p.name.endswith("_log.out")]
    assert len(outs) == 2  # two jobs of one task each
    # Each job recorded its cell (it reports the rows on file when it ends: 1 or 2).
    assert all("rows (0 failed)" in p.read_text() for p in outs)


def test_job_with_two_tasks_runs_one_rank_per_task(tmp_path):
    df, logs = sweep(tmp_path, "algorithms=[ring,torch]", "hydra.launcher.tasks_per_node=2")
    check_rows(df)
    outs = {p.name.split("_")[1]: p.read_text() for p in logs if p.name.endswith("_log.out")}
    assert sorted(outs) == ["0", "1"]  # one job, tasks 0 and 1
    # Task 0 is rank 0 and records the grid; task 1 is rank 1 and records nothing. Had
    # each task spawned ranks of its own, both would report their rows.
    assert "2 rows (0 failed)" in outs["0"]
    assert "rows (" not in outs["1"]
