"""`overlap`: DDP's step time with its bucket all-reduces overlapped with backward and
without, across bucket sizes, on loopback and on a simulated link.

A cell is (network, bucket_cap_bytes, overlap): `ranks.run` trains the GPT with
distbench's `DDP` on `world_size` ranks and times `repeats` steps (after `warmup`), the
slowest rank's, as forward | backward | the rest, with each step's bucket timeline. With
`paired` (the default) each cell also times the other overlap setting on a twin replica
in alternating steps: `paired_speedup` (serial ÷ overlapped, ratio of the medians) is
then measured side by side, immune to drift between cells on a shared host. The cell
carries its `ranks.Plan` (the link, and the sides to run). Cells of one network and
bucket cap run back to back, serial first.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from bench.charts import Chart
from bench.experiments.base import Cell, Experiment
from bench.experiments.overlap import report
from bench.experiments.overlap.config import OverlapConfig, network_label
from bench.experiments.overlap.ranks import Plan, run

__all__ = ["EXPERIMENT", "OverlapConfig", "cells", "network_label", "to_row"]

# A step's timings and counts, each reduced to the slowest (largest) rank, median step.
PHASES = ("forward_s", "backward_s", "rest_s", "allreduce_s", "exposed_sync_s", "last_bucket_s")
PER_STEP = ("bytes_sent", "rounds", "simulated_s")


def cells(cfg: OverlapConfig) -> list[Cell]:
    """Every (network, bucket cap, overlap), overlap off before on within a pair; each
    cell carries its plan: the link, its own overlap flag and (paired) its twin's."""
    return [
        Cell(
            world_size=cfg.world_size,
            fn=run,
            key={"network": network_label(network), "bucket_cap_bytes": cap, "overlap": overlap},
            carry=Plan(
                network=dict(network) if network is not None else None,
                sides=(overlap, not overlap) if cfg.paired else (overlap,),
            ),
        )
        for network in cfg.networks
        for cap in cfg.bucket_caps_bytes
        for overlap in sorted(cfg.overlap)
    ]


def _per_step(per_rank: list[dict], key: str, reduce=max) -> list[float]:
    """One value per timed step: `reduce` over the ranks."""
    return [reduce(values) for values in zip(*(r[key] for r in per_rank), strict=True)]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _hidden_fraction(per_rank: list[dict]) -> list[float]:
    """Per step, the mean over ranks of each rank's hidden share of its all-reduce time."""
    return [
        statistics.fmean(h / a if a > 0 else 0.0 for h, a in pairs)
        for pairs in zip(
            *(zip(r["hidden_s"], r["allreduce_s"], strict=True) for r in per_rank), strict=True
        )
    ]


def to_row(cfg: OverlapConfig, cell: Cell, per_rank: list[dict]) -> dict:
    """Li et al. (VLDB 2020, "PyTorch Distributed") put the ideal at forward + max(backward,
    all-reduce) + optimizer against the serial forward + backward + all-reduce + optimizer.
    With buckets, the last one (the gradients backward produces last) cannot start before
    backward ends, so overlap can save at most min(backward, all-reduce − last bucket's
    all-reduce) per step. The report derives that bound from the serial cell's own measured
    times.
    """
    first = per_rank[0]
    network = cell.carry.network or {}
    median = {k: _median(_per_step(per_rank, k)) for k in (*PHASES, *PER_STEP)}
    return {
        **cell.key,
        "latency_ms": network.get("latency_ms", 0.0),
        "bandwidth_mbps": network.get("bandwidth_mbps", math.inf),
        "world_size": cell.world_size,
        "params": first["params"],
        "grad_bytes": sum(first["bucket_bytes"]),
        **{f"model_{k}": v for k, v in cfg.model.items()},
        "batch_size": cfg.batch_size,
        "steps": len(first["step_times_s"]),
        "buckets": first["buckets"],
        "largest_bucket_bytes": max(first["bucket_bytes"]),
        "step_time_s": _median(first["step_times_s"]),
        "step_time_min_s": min(first["step_times_s"], default=math.nan),
        **{k: median[k] for k in PHASES},
        # Mean over ranks of each step's hidden seconds / hidden share; median step.
        "hidden_s": _median(_per_step(per_rank, "hidden_s", statistics.fmean)),
        "hidden_fraction": _median(_hidden_fraction(per_rank)),
        "overlapped_steps": sum(_per_step(per_rank, "overlapped", all)),
        "bytes_per_step": median["bytes_sent"],
        "rounds_per_step": median["rounds"],
        "simulated_s": median["simulated_s"],
        "loss": statistics.fmean(r["losses"][-1] for r in per_rank),
        # per step (the mean over ranks) and rank 0's step times: wandb draws them as curves
        "losses": json.dumps(
            [statistics.fmean(step) for step in zip(*(r["losses"] for r in per_rank), strict=True)]
        ),
        "step_times_s": json.dumps(first["step_times_s"]),
        "param_digest": first["param_digest"],
        "update_error": first.get("update_error", math.nan),
        "wrong": first["wrong"],
        **_paired(cell, first),
    }


def _paired(cell: Cell, first: dict) -> dict[str, Any]:
    """The twin's median step time and serial ÷ overlapped from the alternating steps
    (NaN without a twin)."""
    twin = _median(first["twin_step_times_s"])
    own = _median(first["step_times_s"])
    serial, overlapped = (twin, own) if cell.key["overlap"] else (own, twin)
    return {
        "twin_step_time_s": twin,
        "twin_backward_s": _median(first["twin_backward_s"]),
        "paired_speedup": serial / overlapped if overlapped > 0 else math.nan,
        "twin_same_parameters": first["twin_param_digest"] == first["param_digest"]
        if first["twin_param_digest"]
        else None,
    }


EXPERIMENT = Experiment(
    name="overlap",
    summary="DDP with bucket all-reduces overlapped with backward, and without",
    schema=OverlapConfig,
    key_columns=("network", "bucket_cap_bytes", "overlap"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Step time against bucket cap",
            x="bucket_cap_bytes",
            y="step_time_s",
            group="overlap",
            kind="scatter",
            log_x=True,
        ),
        Chart(
            title="All-reduce time hidden behind backward",
            x="bucket_cap_bytes",
            y="hidden_fraction",
            group="network",
            kind="scatter",
            log_x=True,
        ),
        Chart(
            title="Exposed sync per step",
            x="bucket_cap_bytes",
            y="exposed_sync_s",
            group="overlap",
            kind="scatter",
            log_x=True,
        ),
    ),
)
