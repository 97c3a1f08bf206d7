"""Runs an experiment's grid, cell by cell, and writes its results and report.

`cluster=local` spawns each world size's ranks once (a `RankPool`) and feeds it the
cells of that size; a cell whose ranks raise, crash or hang past `timeout_s` becomes a
failed row and the grid goes on. An `in_process` experiment (arithmetic, nothing measured)
has its cells called here, without ranks. `cluster=torchrun` (and SLURM tasks) make this process
one rank of an external launch: every rank runs the same cells, rank 0 records them.
Each finished cell is written to results.csv at once (atomically), so an interrupted
grid loses nothing and `resume=true` skips the cells already done with the same settings.
A row is "ok", "wrong" (measured, but off its reference) or "failed"; the caller turns a
grid with any row not ok into a failed run (`bench.app`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import signal
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from bench.config import CLUSTER_KINDS, ClusterConfig, WandbConfig
from bench.experiments.base import Cell, Experiment
from bench.launch import RankFailure, RankPool
from bench.results import ResultStore, run_metadata, settings_hash
from bench.wandb_log import WandbLogger

__all__ = ["Interrupted", "run_experiment"]

log = logging.getLogger("bench")


def run_experiment(
    experiment: Experiment,
    cfg,
    *,
    report_dir: Path,
    cluster: ClusterConfig,
    resume: bool,
    wandb_cfg: WandbConfig,
    append: bool = False,
    sweep: str | None = None,
) -> pd.DataFrame:
    """Measure every cell of `cfg`'s grid (on resume, skipping cells finished with the same
    settings), then report; return the rows of this grid (failed and wrong ones included).

    Before any rank starts, `ResultStore.check` refuses a report_dir that cannot hold the
    results (a ValueError, one line) and the run claims the directory. Each row carries the
    `settings_hash` of the settings that change a measurement and the `run_id` of the run
    that measured it; rows of earlier grids are dropped from results.csv and the report
    unless `append` (then the report marks them as earlier). The jobs of one Hydra `sweep`
    (its id) share report_dir and write one grid together.
    """
    store = ResultStore(report_dir, experiment.key_columns, experiment.key_defaults)
    as_rank = _is_one_rank(cluster.kind)
    rank = int(os.environ.get("RANK", 0)) if as_rank else 0
    store.check(experiment.name)
    grid = Grid.of(experiment, cfg, cluster, sweep)
    claim = store.claim(shared=sweep is not None) if rank == 0 else contextlib.nullcontext()
    try:
        with _signals_as_exit(), claim:
            return _run_claimed(
                experiment,
                cfg,
                store,
                grid,
                cluster,
                rank,
                as_rank,
                resume=resume,
                append=append,
                wandb_cfg=wandb_cfg,
            )
    except Interrupted as stop:
        log.error(
            "%s: interrupted by %s; the finished cells' rows are in %s (rerun with "
            "resume=true to skip them)",
            experiment.name,
            stop.name,
            store.path,
        )
        raise


@dataclass
class Grid:
    """This run's cells and what ties their rows to it: the settings hash and the run id."""

    cells: list[Cell]
    settings: dict
    settings_hash: str
    run_id: str
    sweep: bool

    @classmethod
    def of(cls, experiment: Experiment, cfg, cluster: ClusterConfig, sweep: str | None) -> Grid:
        settings = measured_settings(experiment, cfg, cluster)
        # The random part: two runs of one process within one second (tests, a script calling
        # run_experiment twice) would otherwise share an id, and the second would keep the
        # first's rows as its own (a rerun without resume read b, c, a for a, b, c).
        run_id = sweep or f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}"
        cells = experiment.cells(cfg)
        if not cells:  # an empty report with exit status 0 would read as a success
            raise ValueError(
                f"experiment {experiment.name}: the grid has no cells (its keys "
                "select nothing to run); nothing was run"
            )
        return cls(cells, settings, settings_hash(settings), run_id, bool(sweep))


def measured_settings(experiment: Experiment, cfg, cluster: ClusterConfig) -> dict:
    """The settings that change a measurement: every config key but the grid's axes (list
    values and key columns: they choose which cells exist, and the key says where in them),
    `timeout_s` and the experiment's `unmeasured` keys; plus the cluster's backend and device."""
    values = asdict(cfg)
    skip = {*experiment.key_columns, *experiment.unmeasured, "timeout_s"}
    kept = {k: v for k, v in values.items() if k not in skip and not isinstance(v, list)}
    return {**kept, "backend": cluster.backend, "device": cluster.device}


def _run_claimed(
    experiment, cfg, store, grid, cluster, rank, as_rank, *, resume, append, wandb_cfg
) -> pd.DataFrame:
    cells = grid.cells
    this_grid = {store.key_of(c.key) for c in cells}
    resumed = store.finished_keys(grid.settings_hash) & this_grid if resume else set()
    todo = [c for c in cells if store.key_of(c.key) not in resumed]
    logger = WandbLogger(
        mode=wandb_cfg.mode if rank == 0 else "disabled",
        project=wandb_cfg.project,
        entity=wandb_cfg.entity,
        experiment=experiment.name,
        group=grid.run_id,  # a sweep's jobs share it: one group per experiment run
        key_columns=experiment.key_columns,
        charts=experiment.charts,
        config={
            "experiment": experiment.name,
            **asdict(cfg),
            "cluster": asdict(cluster),
            "settings_hash": grid.settings_hash,
        },
    )
    if resume:
        log.info(
            "resume: %d of %d cells already finished with these settings (%s)",
            len(cells) - len(todo),
            len(cells),
            grid.settings_hash,
        )

    def ours(record: dict) -> bool:
        """A stored row (as CSV text) of this grid: measured by this run (or a job of its
        sweep), or kept by resume (in a sweep: any finished row with these settings, as
        the sibling jobs resume theirs)."""
        if record.get("run_id") == grid.run_id:
            return True
        if grid.sweep:
            same = record.get("settings_hash") == grid.settings_hash
            return resume and same and record.get("status") == "ok"
        return store.text_key(record) in resumed

    writer = RowWriter(store, None if append else ours, logger)
    try:
        if as_rank:
            _run_as_rank(experiment, cfg, cells, todo, writer, grid, cluster)
        else:
            _run_local(experiment, cfg, todo, len(cells), writer, grid, cluster)
        if rank != 0:
            return pd.DataFrame()
        writer.prune()
        # Multirun jobs of one sweep share report_dir: one report writer at a time, each
        # reading every row written so far.
        with store.locked():
            df = store.read()
            if append:
                df["earlier"] = [not ours(_as_text(r)) for r in df.to_dict("records")]
            headline = experiment.report_on(df, Path(store.report_dir), cfg)
        logger.log_report(df, headline, Path(store.report_dir))
        return df[[store.key_of(r) in this_grid for r in df.to_dict("records")]]
    finally:
        logger.finish()


def _as_text(record: dict) -> dict:
    """A typed row as the text its CSV line holds, near enough for `ours` (which reads the
    key, run_id, settings_hash and status)."""
    return {k: "" if v is None or v != v else str(v) for k, v in record.items()}


class RowWriter:
    """Writes each finished row at once; without append, the first write also drops the
    rows of earlier grids (`keep` refuses them), logging how many."""

    def __init__(self, store: ResultStore, keep, logger: WandbLogger) -> None:
        self.store, self.keep, self.logger = store, keep, logger

    def write(self, row: dict) -> None:
        self._dropped(self.store.write([row], keep=self.keep))
        self.logger.log_row(row)

    def prune(self) -> None:
        """Drop the rows of earlier grids even when no cell ran (a resumed, finished grid)."""
        if self.keep is not None and self.store.path.exists():
            self._dropped(self.store.write([], keep=self.keep))

    def _dropped(self, count: int) -> None:
        if count:
            log.warning(
                "results.csv: dropped %d row(s) of earlier grids or settings "
                "(append=true keeps them)",
                count,
            )


class Interrupted(SystemExit):
    """The run was stopped by a signal: exit status 128 + its number (130 for Ctrl-C, 143
    for SIGTERM), as a shell reports it; uncaught, it ends the process without a traceback."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.name = signal.Signals(signum).name


@contextlib.contextmanager
def _signals_as_exit():
    """Ctrl-C (SIGINT) and SIGTERM (scancel, timeout, a container stop) end the run alike:
    `Interrupted` unwinds it, so the rank pool closes and the claim is released, instead of
    a KeyboardInterrupt traceback or the process vanishing mid-write."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum, frame):
        raise Interrupted(signum)

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:  # e.g. a shell's background job
            previous[signum] = signal.signal(signum, _exit)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


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


def _row(
    experiment: Experiment,
    cfg,
    cell: Cell,
    per_rank,
    error: str | None,
    meta: dict,
    report_dir: Path,
) -> dict:
    """The cell's row: "failed" with its error, "wrong" when it measured results off its
    reference (`wrong > 0`), else "ok"; with the run's metadata."""
    if error is not None:
        return {**cell.key, "status": "failed", "error": error, **meta}
    try:
        row = experiment.row(cfg, cell, per_rank, report_dir)
    except (
        Exception
    ) as failure:  # e.g. its trace could not be written: the cell fails, not the grid
        text = f"making its row: {type(failure).__name__}: {failure}"
        return {**cell.key, "status": "failed", "error": text, **meta}
    wrong = pd.to_numeric(pd.Series([row.get("wrong", 0)]), errors="coerce").iloc[0]
    if wrong > 0:
        row.update(status="wrong", error=f"wrong={row['wrong']}: results off the reference")
    else:
        row.update(status="ok", error="")
    return {**row, **meta}


def _run_local(experiment, cfg, todo, total, writer, grid, cluster: ClusterConfig) -> None:
    # An in-process experiment joins no process group: its rows say backend "none".
    backend = "none" if experiment.in_process else cluster.process_group_backend(spawned=True)
    bar = tqdm(total=total, initial=total - len(todo), desc=experiment.name, unit="cell")
    with bar:
        for world_size, group in itertools.groupby(todo, key=lambda c: c.world_size):
            meta = {
                **run_metadata(backend=backend, device=cluster.device, world_size=world_size),
                "settings_hash": grid.settings_hash,
                "run_id": grid.run_id,
            }
            if experiment.in_process:
                pool = _InProcess()
            else:
                pool = RankPool(world_size, backend=backend, timeout_s=cfg.timeout_s)
            with pool:
                before = _probe(experiment)
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
                    after = _probe(experiment)
                    row = _row(
                        experiment, cfg, cell, per_rank, error, meta, writer.store.report_dir
                    )
                    if before is not None:
                        row.update(
                            host_probe_s=(before + after) / 2,
                            host_probe_before_s=before,
                            host_probe_after_s=after,
                        )
                    before = after
                    writer.write(row)
                    bar.update()


class _InProcess(contextlib.AbstractContextManager):
    """The rank pool of an `in_process` experiment: the cell's function, called here as its
    one rank; what it raises fails the cell as a rank's exception would, and a cell still
    running after `timeout_s` is stopped (SIGALRM, on the main thread) and fails as a
    timed-out rank does."""

    def __exit__(self, *exc_info) -> None:
        return None

    def run(self, fn, *args, timeout_s: float) -> list[dict]:
        with _alarm(timeout_s):
            try:
                return [fn(*args)]
            except _CellTimeout:
                raise RankFailure({0: f"timed out after {timeout_s:g} s"}) from None
            except Exception:
                raise RankFailure({0: traceback.format_exc()}) from None


class _CellTimeout(BaseException):
    """Raised into an in-process cell at its time limit (a BaseException, so the cell's
    own `except Exception` cannot swallow it)."""


@contextlib.contextmanager
def _alarm(timeout_s: float):
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only: no limit here
        return

    def _expired(signum, frame):
        raise _CellTimeout

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _probe(experiment: Experiment) -> float | None:
    """The host probe's step seconds now, for an experiment that records it (else None)."""
    if not experiment.host_probe:
        return None
    from bench.kit.host import host_probe

    return host_probe()


def _run_as_rank(experiment, cfg, cells, todo, writer, grid, cluster: ClusterConfig) -> None:
    """This process is one rank of torchrun / SLURM: run the cells of our world size."""
    import torch
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        backend = cluster.process_group_backend(spawned=False)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, timeout=timedelta(seconds=cfg.timeout_s))
    try:
        _run_cells_as_rank(experiment, cfg, cells, todo, writer, grid)
    finally:
        # The group this rank made is closed here, not left to the interpreter's exit: a
        # gloo group destroyed at exit aborted a torchrun rank ("terminate called without
        # an active exception", SIGABRT) while rank 0 still wrote the report, and torchrun's
        # agent on rank 0's node then waited for the failed node until the test's timeout.
        if owned:
            dist.destroy_process_group()


def _run_cells_as_rank(experiment, cfg, cells, todo, writer, grid) -> None:
    """The cells of this rank's world size, every rank together; rank 0 writes the rows."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    store = writer.store
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
    meta = {
        **run_metadata(backend=dist.get_backend(), device=device, world_size=world),
        "settings_hash": grid.settings_hash,
        "run_id": grid.run_id,
    }
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
            writer.write(row)
    dist.barrier()
