"""`cluster=slurm` through Hydra's submitit launcher, run here with its local executor.

A failure here means the SLURM path is broken where no cluster is needed to see it:
`cluster=slurm` does not compose with the launcher, its time limit, partition and requeue
count are not the `cluster.*` keys, a job of one task does not spawn its ranks, a job of
several tasks does not make each task one rank of one process group, concurrent jobs of
one sweep lose each other's rows in results.csv, or a job killed at its time limit is not
requeued — or is, but measures again the cells it had finished.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from bench.app import CONFIG_DIR

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


def sweep_command(tmp_path: Path, grid: list[str], *overrides: str) -> tuple[list, dict]:
    """The command and environment of a submitit_local multirun of `grid`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["WANDB_MODE"] = "disabled"
    command = [
        *(sys.executable, "-m", "bench", "-m", *grid),
        *("cluster=slurm", "hydra/launcher=submitit_local"),
        *(f"report_dir={tmp_path / 'report'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"),
        *overrides,
    ]
    return command, env


def sweep(tmp_path: Path, grid: list[str], *overrides: str):
    """Run a submitit_local multirun; return results.csv, the jobs' logs and the output."""
    command, env = sweep_command(tmp_path, grid, *overrides)
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    logs = sorted((tmp_path / "sweep" / ".submitit").glob("*/*_log.*"))
    detail = done.stdout[-3000:] + done.stderr[-3000:]
    detail += "".join(f"\n--- {p.name} ---\n{p.read_text()[-3000:]}" for p in logs)
    assert done.returncode == 0, detail
    assert (tmp_path / "report" / "results.csv").exists(), detail
    return pd.read_csv(tmp_path / "report" / "results.csv"), logs, detail


def check_rows(df: pd.DataFrame) -> None:
    assert sorted(df["algorithm"]) == ["ring", "torch"]
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert (df["wrong"] == 0).all()
    assert (df["backend"] == "gloo").all() and (df["world_size"] == 2).all()


def test_time_limit_partition_and_requeues_are_cluster_keys():
    keys = ["cluster.timeout_min=7", "cluster.partition=gpu", "cluster.requeues=5"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        slurm = compose("config", [*TINY_GRID, "cluster=slurm", *keys], return_hydra_config=True)
        local = compose(
            "config",
            [*TINY_GRID, "cluster=slurm", "hydra/launcher=submitit_local", *keys],
            return_hydra_config=True,
        )
    launcher = OmegaConf.to_container(slurm.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert (launcher["timeout_min"], launcher["partition"], launcher["max_num_timeout"]) == (
        7,
        "gpu",
        5,
    )
    assert OmegaConf.to_container(local.hydra.launcher, resolve=True)["timeout_min"] == 7
    assert (slurm.cluster.kind, slurm.cluster.backend) == ("slurm", "auto")


def test_sweep_of_single_task_jobs_spawns_ranks_and_shares_results(tmp_path):
    # Two jobs at once, one algorithm each; each job spawns its 2 ranks like cluster=local,
    # and both write the same results.csv (the store's lock keeps both rows).
    df, logs, _ = sweep(tmp_path, TINY_GRID, "algorithms=[ring],[torch]")
    check_rows(df)
    outs = [p for p in logs if p.name.endswith("_log.out")]
    assert len(outs) == 2  # two jobs of one task each
    # Each job recorded its one cell and says so in its summary line.
    for out in outs:
        assert re.search(r"allreduce_scaling: 1 ok, 0 failed, 0 wrong -> ", out.read_text()), out


def test_job_with_two_tasks_runs_one_rank_per_task(tmp_path):
    df, logs, _ = sweep(
        tmp_path, TINY_GRID, "algorithms=[ring,torch]", "hydra.launcher.tasks_per_node=2"
    )
    check_rows(df)
    outs = {p.name.split("_")[1]: p.read_text() for p in logs if p.name.endswith("_log.out")}
    assert sorted(outs) == ["0", "1"]  # one job, tasks 0 and 1
    # Task 0 is rank 0 and records the grid; task 1 is rank 1 and records nothing. Had
    # each task spawned ranks of its own, both would report their rows.
    assert "allreduce_scaling: 2 ok, 0 failed, 0 wrong -> " in outs["0"]
    assert " ok, " not in outs["1"]


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_preempted_job_is_requeued_and_resumes_its_grid(tmp_path):
    # SLURM signals a job it preempts or is about to kill at its time limit (submitit's
    # USR2); the launcher checkpoints it and the job runs again, here under submitit's local
    # executor. Signalled after its second cell, the job must come back and measure only
    # the cells it had not finished.
    sizes = [4096 * k for k in range(1, 13)]
    grid = [
        *TINY_GRID[:2],
        f"message_bytes=[{','.join(map(str, sizes))}]",
        "algorithms=[ring]",
        "paired=false",
        "repeats=2",
        "warmup=0",
        "window_s=0.3",
        "max_iters=100000",
        "timeout_s=60",
        "wandb.mode=disabled",
    ]
    command, env = sweep_command(tmp_path, grid)
    results = tmp_path / "report" / "results.csv"
    with subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        deadline = time.monotonic() + 120
        while not (results.exists() and len(pd.read_csv(results)) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)
        # The job's folder is named after its id: the pid of submitit's local controller.
        (controller,) = [int(p.name) for p in (tmp_path / "sweep" / ".submitit").glob("[0-9]*")]
        for task in _children(controller):
            os.kill(task, signal.SIGUSR2)
        output = proc.communicate(timeout=240)[0]
    logs = sorted((tmp_path / "sweep" / ".submitit").glob("*/*_log.*"))
    detail = output[-3000:] + "".join(f"\n--- {p.name} ---\n{p.read_text()[-3000:]}" for p in logs)
    assert proc.returncode == 0, detail
    assert "Requeued job" in detail and "requeued SLURM job: resuming its grid" in detail
    df = pd.read_csv(results)
    assert sorted(df["message_bytes"]) == sizes and (df["status"] == "ok").all(), detail
    # One timestamp per run of the job: the rows of the first were kept, not measured again
    # (the upserted rows of a re-run would all carry the second's).
    assert df["timestamp"].nunique() == 2, df["timestamp"].tolist()
    assert f"allreduce_scaling: {len(sizes)} ok, 0 failed, 0 wrong -> " in detail
