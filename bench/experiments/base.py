"""What an experiment is: a typed config, a grid of cells, rank-side code, a row per
cell, and a report. The runner (`bench.runner`) needs nothing else.

A `Cell` is one measured configuration: its key (the row's identity), its world size,
the function every rank runs (`fn(cfg, cell) -> dict`, given the typed config and the
cell itself) and `carry`, anything the parent built once for the cell (a pipeline plan, a
derived setting) that the ranks and `to_row` then share instead of rebuilding it. Both are
generic in the config type `C`: `Experiment[C]` ties its schema, its cells' functions and
`to_row` to one config class, and every cell function is annotated with it
(tests/test_seam.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:  # rank processes unpickle `Cell` from here: keep pandas and plots out
    import pandas as pd

    from bench.charts import Chart
    from bench.report.skeleton import Report

__all__ = ["Cell", "Experiment"]

C = TypeVar("C")
"""An experiment's typed config (its `schema`)."""


@dataclass(frozen=True, kw_only=True)
class Cell(Generic[C]):
    """One grid cell: `fn(cfg, cell)` runs on `world_size` ranks; `key` identifies its row."""

    world_size: int
    key: dict[str, Any]
    fn: Callable[[C, Cell[C]], dict[str, Any]]
    carry: Any = None
    """What the parent built once for the cell; its type is the experiment's own (each
    experiment's ranks.py names it where it reads it)."""


@dataclass(frozen=True, kw_only=True)
class Experiment(Generic[C]):
    """Everything that is one experiment's own; see `bench/experiments/README.md`."""

    name: str
    summary: str
    """One line: what the experiment measures."""
    schema: type[C]
    """The typed config (a kw_only dataclass): every key, its default and its checks."""
    key_columns: tuple[str, ...]
    cells: Callable[[C], list[Cell[C]]]
    to_row: Callable[[C, Cell[C], list[dict]], dict]
    """(cfg, cell, every rank's result) -> the cell's row."""
    report: Report
    key_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Key columns added after results files existed, each with the value that a row of
    an older results.csv (which lacks the column) stands for: such a file is read, resumed
    and extended, not refused as another experiment's."""
    reads: tuple[str, ...] = ()
    """Experiments whose results this one's report reads (`make reports` runs them first)."""
    unmeasured: tuple[str, ...] = ()
    """Config keys that change no measurement (where files go): left out of the settings
    a row is tied to, so changing them does not make `resume=true` measure again."""
    artefacts: Callable[[C, Cell[C], list[dict], Path], dict] | None = None
    """(cfg, cell, every rank's result, report_dir) -> columns naming the files it wrote
    there for the cell (traces); kept apart from `to_row`, which only builds the row."""
    host_probe: bool = False
    """Time `bench.kit.host.host_probe` in the parent between this experiment's cells (its
    ranks idle) and record, per row, how fast the host ran around the cell: `host_probe_s`,
    the mean of the probes just before and just after it (`host_probe_before_s`,
    `host_probe_after_s`). For rows that predictions calibrated at another time are held
    to (`planner_validation`). Local runs only: a torchrun / SLURM rank records none."""
    in_process: bool = False
    """Cells that are arithmetic (a model or a search, nothing measured): the runner calls
    each cell's function in its own process, one "rank", with no rank pool or process
    group; an exception still becomes the cell's failed row."""
    charts: tuple[Chart, ...] = ()
    """The headline figures as data (`bench.charts.Chart`): wandb draws each from the
    results table, and the saved dashboard gives each a panel."""

    def parse(self, values: Mapping[str, Any]) -> C:
        from bench.config import parse_config

        return parse_config(self.name, self.schema, values)

    def rank_call(self, cfg: C, cell: Cell[C]) -> tuple[Callable[..., dict], tuple]:
        """What every rank of `cell` runs: (function, arguments)."""
        return cell.fn, (cfg, cell)

    def row(self, cfg: C, cell: Cell[C], per_rank: list[dict], report_dir: Path) -> dict:
        row = self.to_row(cfg, cell, per_rank)
        if self.artefacts is not None:
            row.update(self.artefacts(cfg, cell, per_rank, Path(report_dir)))
        return row

    def report_on(self, df: pd.DataFrame, report_dir: Path, cfg: C | None) -> dict:
        from bench.report.skeleton import write_report

        settings = asdict(cfg) if cfg is not None else {}
        return write_report(
            self.report,
            df,
            report_dir,
            experiment=self.name,
            key_columns=self.key_columns,
            settings=settings,
        )
