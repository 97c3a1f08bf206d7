"""Runs an experiment's grid, cell by cell, and writes its results and report.

`cluster=local` spawns each world size's ranks once (a `RankPool`) and feeds it the
cells of that size; a cell whose ranks raise, crash or hang past `timeout_s` becomes a
failed row and the grid goes on. `cluster=torchrun` (and SLURM tasks) make this process
one rank of an external launch: every rank runs the same cells, rank 0 records them.
Each finished cell is written to results.csv at once (atomically), so an interrupted
grid loses nothing and `resume=true` skips the cells already done.
"""

from __future__ import annotations

import itertools
import logging
import os
import traceback
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from bench.experiments.base import Cell, Experiment
from bench.launch import RankFailure, RankPool
from bench.results import ResultStore, run_metadata
from bench.wandb_log import WandbLogger

__all__ = ["run_experiment"]

log = logging.getLogger("bench")

CLUSTER_KINDS = ("local", "torchrun", "slurm")


def run_experiment(
    experiment: Experiment,
    cfg,
    *,
    report_dir: Path,
    cluster: dict,
    resume: bool,
    wandb_cfg: dict,
) -> pd.DataFrame:
    """Measure every cell of `cfg`'s grid (skipping finished ones on resume), then report."""
    store = ResultStore(report_dir, experiment.key_columns)
    cells = experiment.cells(cfg)
    done = store.finished_keys() if resume else set()
    todo = [c for c in cells if store.key_of(c.key) not in done]
    as_rank = _is_one_rank(cluster.get("kind", "local"))
    rank = int(os.environ.get("RANK", 0)) if as_rank else 0
    logger = WandbLogger(
        mode=wandb_cfg.get("mode", "offline") if rank == 0 else "disabled",
        project=wandb_cfg.get("project", "distbench"),
        entity=wandb_cfg.get("entity"),
        experiment=experiment.name,
        config={"experiment": experiment.name, **asdict(cfg), "cluster": cluster},
    )
    if resume and len(todo) < len(cells):
        log.info("resume: %d of %d cells already finished", len(cells) - len(todo), len(cells))
    try:
        if as_rank:
            _run_as_rank(experiment, cfg, cells, todo, store, logger, cluster)
        else:
            _run_local(experiment, cfg, todo, len(cells), store, logger, cluster)
        if rank != 0:
            return pd.DataFrame()
        # Multirun jobs of one sweep share report_dir: one report writer at a time, each
        # reading every row written so far.
        with store.locked():
            df = store.read()
            headline = experiment.report_on(df, Path(report_dir), cfg)
        logger.log_report(df, headline, Path(report_dir))
        return df
    finally:
        logger.finish()


def _is_one_rank(kind: str) -> bool:
    """Whether this process is one rank of an external launch (else it spawns its ranks).

    A SLURM job (through submitit, or its local executor) with several tasks runs one rank
    per task, the torch.distributed env:// variables derived from the job; a job of one
    task spawns its ranks itself, as `cluster=local` does.
    """
    if kind not in CLUSTER_KINDS:
        raise ValueError(f"cluster.kind={kind!r}; allowed values: {', '.join(CLUSTER_KINDS)}")
    if kind != "slurm":
        return kind == "torchrun"
    try:
        from submitit.helpers import TorchDistributedEnvironment

        job = TorchDistributedEnvironment()
    except RuntimeError:  # not inside a submitit job: an explicit env:// launch, or none
        return "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if job.world_size <= 1:
        return False
    job.export(set_cuda_visible_devices=False, overwrite=True)
    return True


def _row(experiment: Experiment, cfg, cell: Cell, per_rank, error: str | None, meta: dict,
         report_dir: Path) -> dict:  # fmt: skip
    if error is None:
        row = {**experiment.row(cfg, cell, per_rank, report_dir), "status": "ok", "error": ""}
    else:
        row = {**cell.key, "status": "failed", "error": error}
    return {**row, **meta}


def _run_local(experiment, cfg, todo, total, store, logger, cluster) -> None:
    backend, device = cluster.get("backend", "gloo"), cluster.get("device", "cpu")
    if backend == "auto":  # the spawned pool is the CPU path (its ranks pick no GPU)
        backend = "gloo"
    bar = tqdm(total=total, initial=total - len(todo), desc=experiment.name, unit="cell")
    with bar:
        for world_size, group in itertools.groupby(todo, key=lambda c: c.world_size):
            meta = run_metadata(backend=backend, device=device, world_size=world_size)
            with RankPool(world_size, backend=backend, timeout_s=cfg.timeout_s) as pool:
                for cell in group:
                    bar.set_postfix_str(" ".join(f"{v}" for v in cell.key.values()))
                    per_rank, error = None, None
                    try:
                        fn, args = experiment.rank_call(cfg, cell)
                        per_rank = pool.run(fn, *args, timeout_s=cfg.timeout_s)
                    except RankFailure as failure:
                        error = str(failure).splitlines()[0][:500]
                    except Exception as exc:  # a cell that cannot even be shipped
                        error = f"{type(exc).__name__}: {exc}"[:500]
                    row = _row(experiment, cfg, cell, per_rank, error, meta, store.report_dir)
                    store.write([row])
                    logger.log_row(row)
                    bar.update()


def _run_as_rank(experiment, cfg, cells, todo, store, logger, cluster) -> None:
    """This process is one rank of torchrun / SLURM: run the cells of our world size."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = cluster.get("backend", "auto")
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, timeout=timedelta(seconds=cfg.timeout_s))
    world, rank = dist.get_world_size(), dist.get_rank()
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    # Rank 0's results.csv decides what is left to run (nodes need not share a filesystem).
    decided = [[store.key_of(c.key) for c in todo] if rank == 0 else None]
    dist.broadcast_object_list(decided, src=0)
    keep = set(decided[0])
    todo = [c for c in cells if store.key_of(c.key) in keep]
    mine = [c for c in todo if c.world_size == world]
    if rank == 0 and len(mine) < len(todo):
        sizes = sorted({c.world_size for c in todo} - {world})
        log.warning("torchrun world size is %d: skipping cells for world sizes %s", world, sizes)
    meta = run_metadata(backend=dist.get_backend(), device=device, world_size=world)
    for cell in tqdm(mine, desc=experiment.name, unit="cell", disable=rank != 0):
        try:
            fn, args = experiment.rank_call(cfg, cell)
            outcome = (True, fn(*args))
        except Exception:
            outcome = (False, f"rank {rank}: {traceback.format_exc().splitlines()[-1]}")
        gathered = [None] * world
        dist.all_gather_object(gathered, outcome)
        if rank == 0:
            errors = [value for ok, value in gathered if not ok]
            per_rank = [value for _, value in gathered] if not errors else None
            error = "; ".join(errors) or None
            row = _row(experiment, cfg, cell, per_rank, error, meta, store.report_dir)
            store.write([row])
            logger.log_row(row)
    dist.barrier()
