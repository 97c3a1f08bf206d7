"""Experiment `overlap`: DDP's step time with its bucket all-reduces overlapped with
backward and without, across bucket sizes, on loopback and on a simulated link.

A cell is (network, bucket_cap_bytes, overlap): `bench.overlap_cells` trains the GPT with
distbench's `DDP` on `world_size` ranks and times `repeats` steps (after `warmup`), the
slowest rank's, as forward | backward | the rest, with each step's bucket timeline. With
`paired` (the default) each cell also times the other overlap setting on a twin replica
in alternating steps: `paired_speedup` (serial ÷ overlapped, ratio of the medians) is
then measured side by side, immune to drift between cells on a shared host. Cells of one
network and bucket cap run back to back, serial first.

Li et al. (VLDB 2020, "PyTorch Distributed") put the ideal at forward + max(backward,
all-reduce) + optimizer against the serial forward + backward + all-reduce + optimizer.
With buckets, the last one (the gradients backward produces last) cannot start before
backward ends, so overlap can save at most min(backward, all-reduce − last bucket's
all-reduce) per step. The report derives that bound from the serial cell's own measured
times.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from bench.experiments.common import (
    Cell,
    Experiment,
    check_gpt_model,
    check_positive,
    check_training,
)
from bench.overlap_cells import OverlapCell, run_overlap_cell
from bench.reports import overlap as report
from impls.comm import SimulatedNetwork

__all__ = ["EXPERIMENT", "OverlapConfig", "cells", "network_label", "to_row"]

NETWORK_KEYS = ("latency_ms", "bandwidth_mbps")


def network_label(network: dict[str, float] | None) -> str:
    """ "loopback" for no simulated link, else e.g. "0.5ms-1000Mbps" (latency only: "2ms")."""
    if network is None:
        return "loopback"
    latency = network.get("latency_ms", 0.0)
    bandwidth = network.get("bandwidth_mbps", math.inf)
    label = f"{latency:g}ms"
    return label if math.isinf(bandwidth) else f"{label}-{bandwidth:g}Mbps"


def _unique(key: str, values: list) -> None:
    seen = [repr(v) for v in values]
    repeated = sorted({s for s in seen if seen.count(s) > 1})
    if repeated:
        raise ValueError(f"{key}={values} repeats {', '.join(repeated)}: each cell must be unique")


@dataclass(kw_only=True)
class OverlapConfig:
    bucket_caps_bytes: list[int] = field(default_factory=lambda: [65536, 262144, 1048576, 26214400])
    """DDP bucket caps in bytes, each ≥ 1 (26214400 = 25 MiB, torch's default)."""
    overlap: list[bool] = field(default_factory=lambda: [False, True])
    """false: all-reduce the buckets after backward; true: during it."""
    networks: list[dict[str, float] | None] = field(
        default_factory=lambda: [None, {"latency_ms": 0.5, "bandwidth_mbps": 1000}]
    )
    """Simulated links under the bucket all-reduces: {latency_ms, bandwidth_mbps}; null:
    loopback only."""
    world_size: int = 2
    model: dict[str, Any] = field(
        default_factory=lambda: {
            "vocab_size": 256, "seq_len": 64, "d_model": 128, "n_heads": 4, "n_layers": 4,
        }
    )  # fmt: skip
    """`GPTConfig` keyword arguments."""
    batch_size: int = 8
    """Sequences per rank per step."""
    warmup: int = 3
    repeats: int = 15
    """Timed steps per cell; the median of the slowest rank is reported."""
    paired: bool = True
    """Also time the other overlap setting on a twin replica in alternating steps, so each
    cell measures the speed-up side by side (twice the time per cell)."""
    seed: int = 0
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        check_positive("bucket_caps_bytes", self.bucket_caps_bytes)
        _unique("bucket_caps_bytes", self.bucket_caps_bytes)
        if not self.overlap or any(not isinstance(v, bool) for v in self.overlap):
            raise ValueError(f"overlap={self.overlap}: a non-empty list of true/false")
        _unique("overlap", self.overlap)
        if not self.networks:
            raise ValueError("networks=[]: give at least one entry (null: loopback)")
        for network in self.networks:
            if network is None:
                continue
            if not isinstance(network, dict):
                raise ValueError(f"networks: {network!r} is neither null nor a mapping")
            unknown = sorted(set(network) - set(NETWORK_KEYS))
            if unknown:
                raise ValueError(f"networks: unknown key(s) {unknown} in {network}; allowed: "
                                 f"{', '.join(NETWORK_KEYS)}")  # fmt: skip
            try:
                SimulatedNetwork.from_units(**network)
            except ValueError as error:
                raise ValueError(f"networks: {error}") from error
        _unique("networks", [network_label(n) for n in self.networks])
        check_positive("world_size", [self.world_size], minimum=2)
        check_positive("seed", [self.seed], minimum=0)
        if not isinstance(self.paired, bool):
            raise ValueError(f"paired={self.paired!r}: must be true or false")
        check_training(self, ("batch_size", "repeats"))
        check_gpt_model(self.model)


def cells(cfg: OverlapConfig) -> list[Cell]:
    """Every (network, bucket cap, overlap), overlap off before on within a pair."""
    out = []
    for network in cfg.networks:
        for cap in cfg.bucket_caps_bytes:
            for overlap in sorted(cfg.overlap):
                task = OverlapCell(
                    bucket_cap_bytes=cap,
                    overlap=overlap,
                    network=dict(network) if network is not None else None,
                    model=dict(cfg.model),
                    batch_size=cfg.batch_size,
                    warmup=cfg.warmup,
                    repeats=cfg.repeats,
                    paired=cfg.paired,
                    seed=cfg.seed,
                )
                key = {
                    "network": network_label(network),
                    "bucket_cap_bytes": cap,
                    "overlap": overlap,
                }
                out.append(Cell(world_size=cfg.world_size, key=key, fn=run_overlap_cell,
                                task=task))  # fmt: skip
    return out


def _per_step(per_rank: list[dict], key: str, reduce=max) -> list[float]:
    """One value per timed step: `reduce` over the ranks."""
    steps = len(per_rank[0][key])
    return [reduce(r[key][i] for r in per_rank) for i in range(steps)]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def to_row(cell: Cell, per_rank: list[dict]) -> dict:
    task: OverlapCell = cell.task
    first = per_rank[0]
    network = task.network or {}
    allreduce = _per_step(per_rank, "allreduce_s")
    hidden = [
        statistics.fmean(r["hidden_s"][i] / r["allreduce_s"][i] if r["allreduce_s"][i] > 0
                         else 0.0 for r in per_rank)
        for i in range(len(allreduce))
    ]  # fmt: skip
    return {
        **cell.key,
        "latency_ms": network.get("latency_ms", 0.0),
        "bandwidth_mbps": network.get("bandwidth_mbps", math.inf),
        "world_size": cell.world_size,
        "params": first["params"],
        "grad_bytes": sum(first["bucket_bytes"]),
        **{f"model_{k}": v for k, v in task.model.items()},
        "batch_size": task.batch_size,
        "steps": len(first["step_times_s"]),
        "buckets": first["buckets"],
        "largest_bucket_bytes": max(first["bucket_bytes"]),
        "step_time_s": _median(first["step_times_s"]),
        "step_time_min_s": min(first["step_times_s"], default=math.nan),
        "forward_s": _median(_per_step(per_rank, "forward_s")),
        "backward_s": _median(_per_step(per_rank, "backward_s")),
        "rest_s": _median(_per_step(per_rank, "rest_s")),
        "allreduce_s": _median(allreduce),
        "exposed_sync_s": _median(_per_step(per_rank, "exposed_sync_s")),
        "last_bucket_s": _median(_per_step(per_rank, "last_bucket_s")),
        # Mean over ranks of each step's hidden seconds / hidden share; median step.
        "hidden_s": _median(_per_step(per_rank, "hidden_s", statistics.fmean)),
        "hidden_fraction": _median(hidden),
        "overlapped_steps": sum(
            all(r["overlapped"][i] for r in per_rank) for i in range(len(allreduce))
        ),  # fmt: skip
        "bytes_per_step": _median(_per_step(per_rank, "bytes_sent")),
        "rounds_per_step": _median(_per_step(per_rank, "rounds")),
        "simulated_s": _median(_per_step(per_rank, "simulated_s")),
        "loss": statistics.fmean(r["losses"][-1] for r in per_rank),
        "param_digest": first["param_digest"],
        "wrong": first["wrong"],
        **_paired(task, first),
    }


def _paired(task: OverlapCell, first: dict) -> dict[str, Any]:
    """The twin's median step time and serial ÷ overlapped from the alternating steps
    (NaN without `paired`)."""
    twin = _median(first["twin_step_times_s"])
    own = _median(first["step_times_s"])
    serial, overlapped = (own, twin) if not task.overlap else (twin, own)
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
    schema=OverlapConfig,
    key_columns=["network", "bucket_cap_bytes", "overlap"],
    cells=cells,
    to_row=to_row,
    write_report=report.write_report,
)
