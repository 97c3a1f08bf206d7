"""A fake experiment for runner tests: cells that succeed, raise, crash or hang on purpose.

The cell functions run inside pool ranks, so they live here, in an importable module that
imports nothing heavy at the top (each fresh rank imports it; seconds count on two cores).
Each one first leaves a marker file ``<cell>.rank<r>`` holding its process id, so a test
can tell which cells ran and check afterwards that every rank process is gone.

Run as ``python -m tests.runner_cells REPORT_DIR MARKER_DIR TIMEOUT_S NAME:BEHAVIOUR ...``
to measure a grid in a separate process (a test can then kill that process mid-grid).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FakeConfig", "FakeTask", "LOCAL", "fake_experiment", "rank_pids"]

LOCAL = {"kind": "local", "backend": "gloo", "device": "cpu"}


@dataclass(kw_only=True)
class FakeTask:
    cell: str
    marker_dir: str


def _mark(task: FakeTask) -> int:
    import torch.distributed as dist

    rank = dist.get_rank()
    marker = Path(task.marker_dir, f"{task.cell}.rank{rank}")
    partial = marker.with_name(f".{marker.name}.partial")  # a reader never sees it half-written
    partial.write_text(str(os.getpid()))
    os.replace(partial, marker)
    return rank


# Each runs on every rank as `fn(cfg, cell)`; the cell carries its FakeTask.
def succeed(cfg: FakeConfig, cell) -> dict:
    return {"rank": _mark(cell.carry), "pid": os.getpid()}


def raise_on_rank1(cfg: FakeConfig, cell) -> dict:
    if _mark(cell.carry) == 1:
        raise ValueError(f"cell {cell.carry.cell} refuses to run on rank 1")
    return {"rank": 0, "pid": os.getpid()}


def exit_on_rank1(cfg: FakeConfig, cell) -> dict:
    if _mark(cell.carry) == 1:
        os._exit(7)  # no exception, no message: the process is simply gone
    return {"rank": 0, "pid": os.getpid()}


def hang(cfg: FakeConfig, cell) -> dict:
    _mark(cell.carry)
    time.sleep(600)
    return {}


BEHAVIOURS = {"ok": succeed, "raise": raise_on_rank1, "exit": exit_on_rank1, "hang": hang}


@dataclass(kw_only=True)
class FakeConfig:
    cells: list[str] = field(default_factory=list)
    """``NAME:BEHAVIOUR`` in grid order; NAME is the row's key, BEHAVIOUR one of BEHAVIOURS."""
    marker_dir: str
    timeout_s: float = 3.0


def fake_experiment():
    """The `Experiment` of a `FakeConfig` grid: one 2-rank cell per entry, keyed by name."""
    from bench.experiments.base import Cell, Experiment
    from bench.report import Report

    def cells(cfg: FakeConfig) -> list[Cell]:
        out = []
        for spec in cfg.cells:
            name, behaviour = spec.split(":")
            task = FakeTask(cell=name, marker_dir=cfg.marker_dir)
            out.append(Cell(world_size=2, key={"cell": name}, fn=BEHAVIOURS[behaviour],
                            carry=task))  # fmt: skip
        return out

    def to_row(cfg: FakeConfig, cell: Cell, per_rank: list[dict]) -> dict:
        return {**cell.key, "pids": " ".join(str(r["pid"]) for r in per_rank)}

    return Experiment(
        name="runner_faults",
        summary="cells that succeed, raise, exit or hang, for the runner's fault tests",
        schema=FakeConfig,
        key_columns=("cell",),
        cells=cells,
        to_row=to_row,
        report=Report(title="runner faults", intro=""),
    )


def rank_pids(marker_dir: Path) -> dict[str, int]:
    """``{marker name: pid}`` of every rank that started a cell."""
    markers = Path(marker_dir).glob("*.rank*")
    return {p.name: int(p.read_text()) for p in markers if not p.name.startswith(".")}


def main(argv: list[str]) -> None:
    from bench.runner import run_experiment

    report_dir, marker_dir, timeout_s, *cells = argv
    cfg = FakeConfig(cells=cells, marker_dir=marker_dir, timeout_s=float(timeout_s))
    run_experiment(
        fake_experiment(),
        cfg,
        report_dir=Path(report_dir),
        cluster=LOCAL,
        resume=False,
        wandb_cfg={"mode": "disabled"},
    )


if __name__ == "__main__":
    # Through the module's import name, so the ranks unpickle cells as tests.runner_cells.*
    from tests.runner_cells import main as run_grid

    run_grid(sys.argv[1:])
