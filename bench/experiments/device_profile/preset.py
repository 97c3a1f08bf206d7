"""The profile's rows as a hardware preset: the `Hardware` that `hardware=path/to/file.yaml`
reads (`impls.costmodel.hardware_file`), each number with where it was measured.

This module imports `impls` (the preset is its `Hardware`, written through its file
format); the report calls it for that one file and reads nothing else from `impls`.

Where each field of the preset comes from: `build_preset`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from bench.kit.profile import fit_ring

__all__ = ["build_preset", "ring_fits", "write_preset"]


def _numbers(rows: pd.DataFrame, column: str) -> pd.Series:
    return pd.to_numeric(rows[column], errors="coerce") if column in rows else pd.Series()


def _positive(rows: pd.DataFrame, measurement: str, column: str) -> pd.DataFrame:
    """The ok rows of `measurement` whose `column` is a positive finite number."""
    hit = rows[rows["measurement"] == measurement].copy()
    hit[column] = _numbers(hit, column)
    hit = hit[(hit[column] > 0) & hit[column].map(math.isfinite)]
    if hit.empty:
        raise ValueError(f"no {measurement} row with a positive {column}")
    return hit


def ring_fits(rows: pd.DataFrame) -> dict[int, tuple[float, float]]:
    """{N: (α s per round, β s per byte)} of the ring rows at each N with ≥ 2 sizes."""
    ring = _positive(rows, "all_reduce", "time_s")
    fits = {}
    for n, group in ring.groupby(_numbers(ring, "world_size").astype(int)):
        if group["message_bytes"].nunique() >= 2:
            fits[int(n)] = fit_ring(int(n), _numbers(group, "message_bytes"), group["time_s"])
    if not fits:
        raise ValueError("no ring all-reduce timed at ≥ 2 sizes: no link to fit")
    return fits


def _origin(rows: pd.DataFrame) -> dict[str, str]:
    """The date, device and host the rows were measured on."""

    def first(column: str) -> str:
        values = rows[column].dropna().astype(str) if column in rows else pd.Series(dtype=str)
        return values.iloc[0] if len(values) else "?"

    stamps = rows["timestamp"].dropna().astype(str) if "timestamp" in rows else pd.Series()
    return {
        "date": stamps.max()[:10] if len(stamps) else "?",
        "device": first("profiled_device"),
        "host": first("host"),
    }


def _gemm(rows: pd.DataFrame) -> tuple[dict[str, float], tuple, str]:
    """Peaks per dtype, the first dtype's efficiency table, and that dtype."""
    gemm = _positive(rows, "gemm", "flop_rate")
    gemm["flops"] = _numbers(gemm, "flops")
    peaks = {str(d): float(g["flop_rate"].max()) for d, g in gemm.groupby("dtype", sort=False)}
    first = str(gemm["dtype"].iloc[0])
    mine = gemm[gemm["dtype"] == first]
    table = (mine["flop_rate"] / peaks[first]).groupby(mine["flops"]).mean().sort_index()
    return peaks, tuple((float(f), float(e)) for f, e in table.items()), first


_GLOO_ON_GPU = (
    "; assumption: the ring ran on gloo between host processes, not on the "
    "GPUs' own link: run under cluster=torchrun (NCCL) to measure that"
)


def _sources(rows: pd.DataFrame, first: str, ring_n: int, cuda: bool) -> dict[str, str]:
    """Where each number of the preset came from: "measured here, <date>, <device>,
    <host>" and how, or what was assumed."""
    o = _origin(rows)
    here = f"measured here, {o['date']}, {o['device']}, {o['host']}"
    gemm = rows[rows["measurement"] == "gemm"]
    shapes = ", ".join(dict.fromkeys(f"{r.m}×{r.n}×{r.k}" for r in gemm.itertuples()))
    copy = rows[rows["measurement"] == "copy"]["message_bytes"]
    sizes = rows[rows["measurement"] == "all_reduce"]["message_bytes"].nunique()
    threads = int(_numbers(rows[rows["measurement"] == "gemm"], "threads").max())
    ring = rows[rows["measurement"] == "all_reduce"]
    backend = str(ring["backend"].iloc[0]) if "backend" in ring and len(ring) else "?"
    return {
        "peak_flops": f"{here}: the best GEMM rate per dtype over {shapes} (median window, "
        "bench.kit.profile.gemm_step)",
        "gemm_efficiency": f"{here}: {first} GEMM rate per shape ÷ its best, by FLOPs",
        "memory_bandwidth": f"{here}: a {copy.iloc[0]}-byte copy, 2 × its bytes ÷ its time; "
        "elementwise_efficiency 1 (the rate is the achieved one)",
        "kernel_overhead_s": f"{here}: a one-element add, per kernel",
        "intra": f"{here}: this repo's ring all-reduce on {ring_n} ranks ({backend}) at {sizes} "
        "sizes, α per round and β per byte fitted (bench.kit.profile.fit_ring, a median "
        "regression)" + (_GLOO_ON_GPU if cuda and backend == "gloo" else ""),
        "inter": "assumption: one machine profiled, inter = intra; set your cluster's network "
        "here for plans across nodes",
        "devices_per_node": f"{here}: "
        + (
            "the GPUs torch sees"
            if cuda
            else f"the ring's {ring_n} ranks, {threads} thread(s) each"
        ),
        "memory_bytes": f"{here}: "
        + ("the GPU's memory" if cuda else "the host's physical memory ÷ devices_per_node"),
        "comm_overlap": "a GPU's collectives run beside compute"
        if cuda
        else "this repo's collectives block the rank's one computing thread (gloo)",
        "not profiled": "fp8 (refused), FlashAttention (priced as GEMMs), per-action and "
        "meeting costs (0; planner_validation fits them on this host)",
    }


def build_preset(rows: pd.DataFrame) -> Any:
    """The `Hardware` the ok `rows` of a profile describe; ValueError where they cannot
    make one (a measurement missing, or a number that is not positive).

    - `peak_flops[dtype]`: the best GEMM rate of that dtype over the shapes timed;
    - `gemm_efficiency`: the first dtype's rate per shape ÷ its peak, by the GEMM's FLOPs
      (shapes of equal FLOPs averaged), the table the simulator interpolates;
    - `memory_bandwidth`: the copy's bytes moved ÷ its time; `elementwise_efficiency` = 1
      (that rate is already the achieved one);
    - `kernel_overhead_s`: the launch probe's time per kernel;
    - `intra` = `inter`: the ring all-reduce's (α, β) at the largest N (`fit_ring`); one
      machine was profiled, so the link between nodes is that same link: replace `inter` with
      your cluster's network (a preset's, or nccl-tests across nodes) for a multi-node plan;
    - `comm_overlap` / `p2p_blocking`: as this repo's ranks run on the device (a CPU's
      collectives block its one computing thread; a GPU's run beside compute);
    - fp8 and FlashAttention are not profiled: `fp8_gemm_efficiency` and
      `attention_efficiency` stay None (fp8 refused, attention priced as GEMMs), and the
      per-action and meeting costs that `planner_validation` fits stay 0.
    """
    from impls.costmodel.hardware import Hardware, Link

    peaks, table, first = _gemm(rows)
    copy = _positive(rows, "copy", "bandwidth")
    launch = _positive(rows, "launch", "time_s")
    fits = ring_fits(rows)
    n = max(fits)
    alpha, beta = fits[n]
    device = rows[rows["measurement"] != "all_reduce"]
    cuda = "cuda" in set(device.get("device_kind", pd.Series(dtype=str)).astype(str))
    link = Link(
        name=f"ring all-reduce over {n} ranks, measured", alpha_s=alpha, bandwidth=1.0 / beta
    )
    o = _origin(rows)
    return Hardware(
        name=f"{o['device']} on {o['host']}, measured {o['date']}",
        devices_per_node=int(_numbers(device, "devices_per_node").max()),
        peak_flops=peaks,
        memory_bytes=float(_numbers(device, "device_memory_bytes").max()),
        memory_bandwidth=float(copy["bandwidth"].max()),
        intra=link,
        inter=link,
        gemm_efficiency=table,
        elementwise_efficiency=1.0,
        kernel_overhead_s=float(launch["time_s"].min()),
        comm_overlap=cuda,
        p2p_blocking=not cuda,
        sources=_sources(rows, first, n, cuda),
    )


def write_preset(rows: pd.DataFrame, path: Path) -> tuple[Any, str]:
    """(the preset, "") after writing it to `path`; (None, why) when the rows make none."""
    from impls.costmodel.hardware_file import dump_hardware

    try:
        preset = build_preset(rows)
    except (ValueError, RuntimeError, KeyError, IndexError) as error:
        return None, " ".join(str(error).split())
    dump_hardware(preset, path)
    return preset, ""
