"""What an `auto_parallel` cell computes (in the runner's process: nothing is measured):
search once per GPU count (the cells of one count share the search), then return the plan
in the cell's slot."""

from __future__ import annotations

import math
from typing import Any

from bench.experiments.auto_parallel.config import AutoParallelConfig
from bench.experiments.base import Cell

__all__ = ["PLAN_COLUMNS", "run"]

PLAN_COLUMNS = (
    "dp",
    "cp",
    "tp",
    "pp",
    "sp",
    "zero_stage",
    "microbatch_size",
    "num_microbatches",
    "schedule",
    "virtual_stages",
    "recompute",
    "stage_layers",
)
GB = 1e9


_SEARCHES: dict[tuple[str, int], Any] = {}


def _search(cfg: AutoParallelConfig, gpus: int) -> Any:
    """The planner's result for `gpus`, searched once per config: the grid's cells of one
    GPU count (best and rejected plans, each rank of the list) read the same search."""
    from impls.planner import search

    key = (repr(cfg), gpus)
    if key not in _SEARCHES:
        _SEARCHES.clear()  # a new config: the old searches will not be asked again
        _SEARCHES[key] = search(
            cfg.spec(),
            cfg.cluster(),
            gpus=gpus,
            global_batch=cfg.global_batch,
            fixed=cfg.fixed(),
            dtype=cfg.dtype,
            top_k=cfg.top_k,
            allow_cross_node_tp=cfg.allow_cross_node_tp,
            cps=tuple(cfg.cp),
        )
    return _SEARCHES[key]


def published_runs(cfg: AutoParallelConfig) -> list[Any]:
    """Published runs of the config's model architecture on the config's preset."""
    from impls.costmodel.models import model
    from impls.costmodel.published import PUBLISHED_RUNS

    shape = ("n_layers", "d_model", "n_heads", "ffn", "kv_fraction")
    wanted = tuple(getattr(cfg.spec(), name) for name in shape)
    return [
        run
        for run in PUBLISHED_RUNS
        if run.hardware == cfg.hardware_name()
        and tuple(getattr(model(run.model), name) for name in shape) == wanted
    ]


def _published(name: str) -> dict[str, Any]:
    """A published run's own plan priced (`impls.simulator.validation`), with its number."""
    from impls.simulator.validation import published_predictions

    mine = next(p for p in published_predictions() if p.run.name == name)
    return {
        "found": True,
        **plan_columns(mine.plan),
        **prediction_columns(mine.prediction),
        "published_metric": mine.metric,
        "published_value": mine.published,
        "predicted_value": mine.predicted,
        "source": mine.run.source,
    }


def run(cfg: AutoParallelConfig, cell: Cell) -> dict[str, Any]:
    key = cell.key
    if key["list"] == "published":
        return _published(key["run"])
    result = _search(cfg, key["gpus"])
    chosen = result.best if key["list"] == "best" else result.rejected
    common = {
        "search_s": result.seconds,
        "evaluated": result.evaluated,
        "smallest_memory_gb": result.smallest_memory_bytes / GB,
        "device_memory_gb": cfg.cluster().memory_bytes / GB,
    }
    if key["rank"] > len(chosen):
        return {"found": False, **common}
    candidate = chosen[key["rank"] - 1]
    return {
        "found": True,
        **plan_columns(candidate.plan),
        **prediction_columns(candidate.prediction),
        "reason": candidate.reason,
        **common,
    }


def plan_columns(plan: Any) -> dict[str, Any]:
    row = {name: getattr(plan, name) for name in PLAN_COLUMNS}
    layers = row["stage_layers"]
    row["stage_layers"] = "equal" if layers is None else "/".join(map(str, layers))
    return row


def prediction_columns(p: Any) -> dict[str, Any]:
    """The prediction, with the 90% interval the published runs' residuals give its rates
    (`impls.simulator.validation.published_interval`: what a run planned so achieved)."""
    from bench.kit.prediction import prediction_row
    from impls.simulator.validation import published_interval

    interval = published_interval()
    mfu_low, mfu_high = interval.around(p.mfu)
    tokens_low, tokens_high = interval.around(p.tokens_per_s)
    memory = {f"memory_{k}_gb": v / GB for k, v in (p.memory_breakdown or {}).items()}
    return {
        **prediction_row(p),
        "predicted_mfu_low": mfu_low,
        "predicted_mfu_high": mfu_high,
        "predicted_tokens_per_s_low": tokens_low,
        "predicted_tokens_per_s_high": tokens_high,
        "interval_rows": interval.rows,
        **{k: v for k, v in memory.items() if math.isfinite(v)},
    }
