"""A fake experiment for runner tests: cells that succeed, raise, crash or hang on purpose.

The cell functions run inside pool ranks, so they live here, in an importable module that
imports nothing heavy at the top (each fresh rank imports it; seconds count on two cores).
Each one first leaves a marker file ``<cell>.rank<r>`` holding its process id, so a test
can tell which cells ran and check afterwards that every rank process is gone.

Run as ``python -m tests.runner_cells REPORT_DIR MARKER_DIR TIMEOUT_S NAME:BEHAVIOUR ...``
(``--resume``, ``--setting N``) to measure a grid in a separate process, with the exit
status and summary line of ``python -m bench`` (a test can then kill that process mid-grid).
The helpers at the end find rank processes that outlived their run.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.config import ClusterConfig, WandbConfig

__all__ = [
    "LOCAL",
    "FakeConfig",
    "FakeTask",
    "fake_experiment",
    "is_running",
    "rank_descendants",
    "rank_pids",
    "wait_until",
]

LOCAL = ClusterConfig(kind="local", backend="gloo", device="cpu")


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


def kill_rank1(cfg: FakeConfig, cell) -> dict:
    """kill -9 of a rank mid-cell (its peer waits on it until the cell times out or fails)."""
    if _mark(cell.carry) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"rank": 0, "pid": os.getpid()}


def stop_rank1(cfg: FakeConfig, cell) -> dict:
    """SIGSTOP of a rank mid-cell: alive but frozen, so only the cell's timeout ends it."""
    if _mark(cell.carry) == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    return {"rank": 0, "pid": os.getpid()}


def off_reference(cfg: FakeConfig, cell) -> dict:
    """Runs fine but reports 3 values off its reference (a "wrong" row)."""
    return {"rank": _mark(cell.carry), "pid": os.getpid(), "wrong": 3}


BEHAVIOURS = {
    "ok": succeed,
    "raise": raise_on_rank1,
    "exit": exit_on_rank1,
    "hang": hang,
    "kill9": kill_rank1,
    "stop": stop_rank1,
    "wrong": off_reference,
}


@dataclass(kw_only=True)
class FakeConfig:
    cells: list[str] = field(default_factory=list)
    """``NAME:BEHAVIOUR`` in grid order; NAME is the row's key, BEHAVIOUR one of BEHAVIOURS."""
    marker_dir: str
    timeout_s: float = 3.0
    setting: int = 0
    """Stands for any setting that changes a measurement (repeats, window_s, the model)."""


def fake_experiment():
    """The `Experiment` of a `FakeConfig` grid: one 2-rank cell per entry, keyed by name."""
    from bench.experiments.base import Cell, Experiment
    from bench.report import Report

    def cells(cfg: FakeConfig) -> list[Cell]:
        out = []
        for spec in cfg.cells:
            name, behaviour = spec.split(":")
            task = FakeTask(cell=name, marker_dir=cfg.marker_dir)
            out.append(Cell(world_size=2, key={"cell": name}, fn=BEHAVIOURS[behaviour], carry=task))
        return out

    def to_row(cfg: FakeConfig, cell: Cell, per_rank: list[dict]) -> dict:
        pids = " ".join(str(r["pid"]) for r in per_rank)
        return {**cell.key, "pids": pids, "wrong": max(r.get("wrong", 0) for r in per_rank)}

    return Experiment(
        name="runner_faults",
        summary="cells that succeed, raise, exit or hang, for the runner's fault tests",
        schema=FakeConfig,
        key_columns=("cell",),
        cells=cells,
        to_row=to_row,
        report=Report(title="runner faults", intro=""),
        unmeasured=("marker_dir",),
    )


def rank_pids(marker_dir: Path) -> dict[str, int]:
    """``{marker name: pid}`` of every rank that started a cell."""
    markers = Path(marker_dir).glob("*.rank*")
    return {p.name: int(p.read_text()) for p in markers if not p.name.startswith(".")}


def main(argv: list[str]) -> None:
    """Measure a grid as `python -m bench` would: a refused report_dir is one line and exit
    status 2; then one summary line, and exit status 1 if any cell was not ok."""
    import argparse

    from bench.app import summary
    from bench.runner import run_experiment

    parser = argparse.ArgumentParser(prog="python -m tests.runner_cells")
    parser.add_argument("report_dir")
    parser.add_argument("marker_dir")
    parser.add_argument("timeout_s", type=float)
    parser.add_argument("cells", nargs="+")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--setting", type=int, default=0)
    args = parser.parse_args(argv)
    cfg = FakeConfig(
        cells=args.cells, marker_dir=args.marker_dir, timeout_s=args.timeout_s, setting=args.setting
    )
    try:
        df = run_experiment(
            fake_experiment(),
            cfg,
            report_dir=Path(args.report_dir),
            cluster=LOCAL,
            resume=args.resume,
            wandb_cfg=WandbConfig(mode="disabled"),
        )
    except ValueError as error:
        print(f"bad config: {error}", file=sys.stderr)
        sys.exit(2)
    line, all_ok = summary("runner_faults", df, Path(args.report_dir))
    print(line, flush=True)
    sys.exit(0 if all_ok else 1)


def is_running(pid: int) -> bool:
    """Alive and not a zombie (a killed rank re-parented to init may linger as one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def rank_descendants() -> dict[int, str]:
    """``{pid: command line}`` of live multiprocessing-spawned descendants of this process.

    The resource tracker that the spawn context starts once per interpreter is not a rank
    and is meant to live as long as we do.
    """
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = {}, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except FileNotFoundError:
            continue
        if is_running(pid) and "spawn_main" in cmdline:
            found[pid] = cmdline
    return found


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


if __name__ == "__main__":
    # Through the module's import name, so the ranks unpickle cells as tests.runner_cells.*
    from tests.runner_cells import main as run_grid

    run_grid(sys.argv[1:])
