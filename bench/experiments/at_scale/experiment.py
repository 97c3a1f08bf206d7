"""`at_scale`: one cell per predicted figure, lecture or published; the simulator prices
each on the one-rank pool. Rows hold the prediction beside the published number."""

from __future__ import annotations

from bench.charts import Chart
from bench.experiments.at_scale import ranks, report
from bench.experiments.at_scale.config import AtScaleConfig
from bench.experiments.base import Cell, Experiment

__all__ = ["EXPERIMENT", "AtScaleConfig", "cells", "to_row"]


def cells(cfg: AtScaleConfig) -> list[Cell]:
    rows = [("lecture", name) for name in cfg.lecture]
    rows += [("published", name) for name in cfg.published_names()]
    return [
        Cell(world_size=1, key={"kind": kind, "name": name}, fn=ranks.run) for kind, name in rows
    ]


def to_row(cfg: AtScaleConfig, cell: Cell, per_rank: list[dict]) -> dict:
    return {**cell.key, **per_rank[0]}


EXPERIMENT = Experiment(
    name="at_scale",
    summary="the simulator's predictions of GPU-cluster training beside the lecture's "
    "figures and published runs",
    schema=AtScaleConfig,
    in_process=True,
    key_columns=("kind", "name"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Simulator against published figures",
            x="published",
            y="predicted",
            group="kind",
            kind="scatter",
            log_x=True,
            log_y=True,
        ),
        Chart(title="Predicted ÷ published", x="name", y="ratio", kind="bar"),
    ),
)
