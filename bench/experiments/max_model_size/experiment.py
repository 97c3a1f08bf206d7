"""`max_model_size`: the largest trainable model per ZeRO stage, from the cost model.

Nothing here needs more than one process, but the runner only knows how to run a cell on
ranks. Each cell is therefore a grid cell like any other on a world of one rank: the
runner's one-rank pool evaluates the formulas (`ranks.run`) and returns the row, so
results.csv gets the same run metadata, atomic writes, `resume` and failure handling as
every experiment, at the cost of starting one rank process (seconds). The metadata's
`world_size` is that 1; the data-parallel degree the formulas are evaluated at is the `dp`
column. Under an external `torchrun` of more than one rank the runner skips one-rank cells
(with a warning): run this experiment with `cluster=local`.
"""

from __future__ import annotations

from bench.charts import Chart
from bench.experiments.base import Cell, Experiment
from bench.experiments.max_model_size import ranks, report
from bench.experiments.max_model_size.config import MaxModelSizeConfig
from impls.costmodel import STAGES

__all__ = ["EXPERIMENT", "MaxModelSizeConfig", "cells", "to_row"]


def cells(cfg: MaxModelSizeConfig) -> list[Cell]:
    """Every memory × N × stage, each on a one-rank world; `carry` is the bytes per
    parameter as the cost model takes them."""
    b = cfg.costs()
    shared = {
        "mp": cfg.mp,
        "params": cfg.params,
        "weight_bytes_per_param": b.weights,
        "grad_bytes_per_param": b.gradients,
        "optim_bytes_per_param": b.optimizer,
    }
    return [
        Cell(
            world_size=1,
            key={"stage": stage, "gpu_memory_gb": memory, "dp": dp, **shared},
            fn=ranks.run,
            carry=b,
        )
        for memory in cfg.gpu_memory_gb
        for dp in cfg.dp
        for stage in STAGES
    ]


def to_row(cfg: MaxModelSizeConfig, cell: Cell, per_rank: list[dict]) -> dict:
    return {**cell.key, **per_rank[0]}


EXPERIMENT = Experiment(
    name="max_model_size",
    summary="the lecture's largest trainable model per ZeRO stage, from the cost model",
    schema=MaxModelSizeConfig,
    in_process=True,
    key_columns=(
        "stage",
        "gpu_memory_gb",
        "dp",
        "mp",
        "params",
        "weight_bytes_per_param",
        "grad_bytes_per_param",
        "optim_bytes_per_param",
    ),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Largest trainable model per ZeRO stage",
            x="dp",
            y="max_params_billions",
            group="stage",
            log_x=True,
            log_y=True,
        ),
        Chart(
            title="Model states per device",
            x="dp",
            y="per_device_gb",
            group="stage",
            log_x=True,
            log_y=True,
        ),
    ),
    reads=("zero_memory",),
)
