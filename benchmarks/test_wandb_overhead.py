"""What logging every cell to wandb costs a grid: offline against disabled.

`make bench` runs this. The same CI-profile grid of cheap cells (the collectives table,
224 cells of ~0.1–0.5 s) runs as `python -m bench` with `wandb.mode=offline` and with
`wandb.mode=disabled`, alternating so that drift of the machine hits both alike; the
recorded figure is the ratio of the median wall times, and beside it that of the CPU
seconds (ranks and wandb's service included), steadier where the host is shared. The
issue's target: ≤ 1.05 wall (a run per cell must stay off the grid's critical path,
`bench.wandb_log`).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
GRID = (
    "experiment=collectives",
    "profile=ci",
    "world_sizes=[2,4]",
    "message_bytes=[1024,4096,16384,65536,262144,1048576,4194304,16777216]",
)
REPEATS = 3
TARGET = 1.05


def _cpu_seconds() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def grid_seconds(root: Path, mode: str, repeat: int) -> tuple[float, float]:
    """Wall and CPU seconds (its ranks and wandb's service included) of one whole
    `python -m bench` run of the grid, start to exit."""
    out = root / f"{mode}-{repeat}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env |= {"WANDB_DIR": str(out), "WANDB_SILENT": "true"}
    out.mkdir(parents=True)
    command = [
        sys.executable,
        "-m",
        "bench",
        *GRID,
        f"report_dir={out / 'report'}",
        f"wandb.mode={mode}",
        f"hydra.run.dir={out / 'hydra'}",
    ]
    start, cpu = time.perf_counter(), _cpu_seconds()
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    assert done.returncode == 0, done.stderr[-3000:]
    return seconds, cpu


def interleaved(root: Path) -> dict:
    """Wall and CPU seconds of each mode, alternating which goes first; the ratios of
    their medians (the CPU one shows what wandb costs where the host is shared)."""
    times: dict[str, list[float]] = {"offline": [], "disabled": []}
    cpu: dict[str, list[float]] = {"offline": [], "disabled": []}
    for repeat in range(REPEATS):
        order = ("offline", "disabled") if repeat % 2 == 0 else ("disabled", "offline")
        for mode in order:
            wall, used = grid_seconds(root, mode, repeat)
            times[mode].append(round(wall, 2))
            cpu[mode].append(round(used, 2))
    ratio, cpu_ratio = (
        statistics.median(t["offline"]) / statistics.median(t["disabled"]) for t in (times, cpu)
    )
    runs = len(list((root / "offline-0" / "wandb").glob("offline-run-*")))
    return {
        "offline_s": times["offline"],
        "disabled_s": times["disabled"],
        "ratio": ratio,
        "offline_cpu_s": cpu["offline"],
        "disabled_cpu_s": cpu["disabled"],
        "cpu_ratio": cpu_ratio,
        "wandb_runs": runs,
    }


def test_offline_logging_overhead(benchmark, tmp_path):
    benchmark.group = "wandb overhead, collectives CI grid"
    result = benchmark.pedantic(interleaved, args=(tmp_path,), rounds=1)
    benchmark.extra_info.update(result)
    print(
        f"\nwandb offline / disabled: {result['ratio']:.3f}x wall (target ≤ {TARGET}x), "
        f"{result['cpu_ratio']:.3f}x CPU; {result}"
    )
    assert result["wandb_runs"] == 7 * 2 * 2 * 8 + 1  # one per cell, one for the report
    assert result["ratio"] <= TARGET, result
