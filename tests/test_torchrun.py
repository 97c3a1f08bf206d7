"""The multi-node path: two torchrun "nodes" on localhost, one rank each, `cluster=torchrun`.

A failure here means `python -m bench ... cluster=torchrun` does not work as one rank of
an external launch: the two nodes do not rendezvous, hang, disagree on the cells, or
rank 0 does not record the measured rows (status ok, wrong 0, the world size and backend
of the launch) in results.csv.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_torchrun_nodes_measure_the_grid_together(tmp_path):
    report_dir = tmp_path / "report"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "SLURM_"))}
    env |= {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    nodes = []
    for node_rank in (0, 1):
        command = [
            *(sys.executable, "-m", "torch.distributed.run"),
            *("--nnodes=2", "--nproc-per-node=1", f"--node-rank={node_rank}"),
            *("--master-addr=127.0.0.1", f"--master-port={port}"),
            *("-m", "bench", "experiment=allreduce_scaling", "cluster=torchrun"),
            *("world_sizes=[2]", "algorithms=[ring,torch]", "message_bytes=[4096]"),
            *("repeats=1", "warmup=1", "window_s=0.005", "timeout_s=60"),
            *(f"report_dir={report_dir}", "wandb.mode=disabled"),
            f"hydra.run.dir={tmp_path / f'hydra-node{node_rank}'}",
        ]
        log = open(tmp_path / f"node{node_rank}.log", "w")  # noqa: SIM115 - closed below
        nodes.append(
            (subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=log), log)
        )
    codes = []
    try:
        for proc, _ in nodes:
            codes.append(proc.wait(LAUNCH_TIMEOUT_S))
    except subprocess.TimeoutExpired:
        codes.append("timed out")  # the logs below say which node hung and why
    finally:
        for proc, log in nodes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    logs = "\n".join(
        f"--- node {i} ---\n{(tmp_path / f'node{i}.log').read_text()[-3000:]}" for i in (0, 1)
    )
    assert codes == [0, 0], logs

    df = pd.read_csv(report_dir / "results.csv")
    assert sorted(df["algorithm"]) == ["ring", "torch"], logs
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert (df["wrong"] == 0).all()
    assert (df["backend"] == "gloo").all() and (df["world_size"] == 2).all()
    assert (df["time_s"] > 0).all()
    # distbench's ring counts its traffic: 2(N-1)/N * S per rank, i.e. S at N = 2.
    ring = df.set_index("algorithm").loc["ring"]
    assert ring["max_rank_bytes_sent"] == 4096
    # Only rank 0 writes the report.
    assert (report_dir / "report.md").exists()
