"""`device_profile`: one cell per measurement — a GEMM per (dtype, shape), the copy, the
launch probe on one rank, then the ring all-reduce per (N, size) — and a hardware preset
file (`hardware.yaml`, `preset.py`) made from the rows beside the report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.charts import Chart
from bench.experiments.base import Cell, Experiment
from bench.experiments.device_profile import ranks, report
from bench.experiments.device_profile.config import DeviceProfileConfig
from bench.kit.collectives import CollectiveCall, collective_row

__all__ = ["EXPERIMENT", "DeviceProfileConfig", "cells", "to_row"]

MESSAGE_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _key(
    measurement: str,
    dtype: str,
    m: int = 0,
    n: int = 0,
    k: int = 0,
    world_size: int = 1,
    message_bytes: int = 0,
) -> dict[str, Any]:
    return {
        "measurement": measurement,
        "dtype": dtype,
        "m": m,
        "n": n,
        "k": k,
        "world_size": world_size,
        "message_bytes": message_bytes,
    }


def cells(cfg: DeviceProfileConfig) -> list[Cell]:
    """The device's cells on one rank, then the ring's, N ascending (one pool per N)."""
    device = [_key("gemm", dtype, m, n, k) for dtype in cfg.dtypes() for m, n, k in cfg.shapes()]
    device += [_key("copy", "fp32", message_bytes=cfg.copy_mib * 2**20), _key("launch", "fp32")]
    out = [Cell(world_size=1, key=key, fn=ranks.run) for key in device]
    ring = CollectiveCall("all_reduce", "distbench", "ring")
    for n in sorted(set(cfg.world_sizes)):
        for size in sorted(set(cfg.message_bytes)):
            key = _key("all_reduce", MESSAGE_DTYPE[cfg.dtype], world_size=n, message_bytes=size)
            out.append(Cell(world_size=n, key=key, fn=ranks.run, carry=ring))
    return out


def to_row(cfg: DeviceProfileConfig, cell: Cell, per_rank: list[dict]) -> dict:
    if cell.key["measurement"] == "all_reduce":
        return collective_row(cell, per_rank, traffic=True)
    return {**cell.key, **per_rank[0]}


@dataclass(frozen=True, kw_only=True)
class _DeviceProfile(Experiment):
    """An experiment whose report also writes the preset file: a stale one is removed
    first, so a run that cannot make one (no cell ran) leaves none behind."""

    def report_on(self, df: Any, report_dir: Path, cfg: Any) -> dict:
        (Path(report_dir) / report.PRESET_FILE).unlink(missing_ok=True)
        return super().report_on(df, report_dir, cfg)


EXPERIMENT = _DeviceProfile(
    name="device_profile",
    summary="this device measured for the simulator: GEMM efficiency by shape, peak per "
    "dtype, memory bandwidth, launch overhead, ring α–β; writes a hardware preset file",
    schema=DeviceProfileConfig,
    key_columns=("measurement", "dtype", "m", "n", "k", "world_size", "message_bytes"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="GEMM rate by FLOPs",
            x="flops",
            y="flop_rate",
            group="dtype",
            kind="scatter",
            log_x=True,
        ),
        Chart(
            title="Ring all-reduce time by size",
            x="message_bytes",
            y="time_s",
            group="world_size",
            kind="scatter",
            log_x=True,
            log_y=True,
        ),
    ),
)
