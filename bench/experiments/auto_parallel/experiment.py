"""`auto_parallel`: the planner's best plans per GPU count, predicted (never measured).

Each cell is one slot of one GPU count's ranking: `list=best, rank=k` is the k-th best
plan, `list=rejected, rank=k` the k-th best of those the planner turned down (too big for
the device, or slower than the best, with the reason). The search itself runs once per GPU
count in the one-rank pool and is cached there, so a grid of slots costs one search each.
Every number in a row is the simulator's output: the report labels it as a model output.
`list=published` slots price each published run of the same model on the same preset
(`impls.costmodel.published`) in its own plan, beside the source's number: what the
planner's best plan gains over it, term by term, is in the report.
"""

from __future__ import annotations

from bench.charts import Chart
from bench.experiments.auto_parallel import ranks, report
from bench.experiments.auto_parallel.config import AutoParallelConfig
from bench.experiments.base import Cell, Experiment

__all__ = ["EXPERIMENT", "AutoParallelConfig", "cells", "to_row"]


def cells(cfg: AutoParallelConfig) -> list[Cell]:
    shared = {
        "model": cfg.model["preset"],
        "hardware": cfg.hardware_name(),
        "gpus_per_node": cfg.cluster().devices_per_node,
        "global_batch": cfg.global_batch,
    }
    slots = [("best", k) for k in range(1, cfg.top_k + 1)]
    slots += [("rejected", k) for k in range(1, cfg.rejected_k + 1)]
    searched = [
        Cell(world_size=1, key={**shared, "gpus": n, "list": kind, "rank": k}, fn=ranks.run)
        for n in cfg.gpus
        for kind, k in slots
    ]
    published = [
        Cell(
            world_size=1,
            fn=ranks.run,
            key={
                **shared,
                "gpus": run.gpus,
                "list": "published",
                "rank": k,
                "run": run.name,
                "global_batch": run.global_batch,
            },
        )
        for k, run in enumerate(ranks.published_runs(cfg), start=1)
    ]
    return searched + published


def to_row(cfg: AutoParallelConfig, cell: Cell, per_rank: list[dict]) -> dict:
    return {**cell.key, **per_rank[0]}


EXPERIMENT = Experiment(
    name="auto_parallel",
    summary="the planner's best DP×TP×PP×SP×ZeRO plans on a GPU cluster, predicted by the "
    "simulator",
    schema=AutoParallelConfig,
    in_process=True,
    key_columns=("model", "hardware", "gpus", "gpus_per_node", "global_batch", "list", "rank"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Predicted MFU of the plans against GPUs",
            x="gpus",
            y="predicted_mfu",
            group="list",
            kind="scatter",
        ),
        Chart(
            title="Plans: step time against peak memory",
            x="predicted_peak_memory_gb",
            y="predicted_step_time_s",
            group="gpus",
            kind="scatter",
        ),
    ),
)
