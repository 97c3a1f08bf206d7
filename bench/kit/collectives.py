"""Timed collectives, nccl-tests style, shared by `allreduce_scaling` and `collectives`.

How a cell is timed and checked: `measure_collective`; how an `auto` cell is tuned and judged beside its alternatives: `calibrated_tuner`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from bench.config import (
    cell_timeout,
    check_choice,
    check_number,
    check_positive,
    iterations_key,
    ranks_key,
    seconds_key,
)
from bench.experiments.base import Cell
from bench.kit.collective_specs import COLLECTIVES
from bench.kit.timing import alternate, calibrate_iters
from impls.collectives import AllReduceTuner
from impls.comm import Communicator
from impls.pairing import common_count

__all__ = [
    "DTYPE_BYTES",
    "CollectiveCall",
    "TimedGridConfig",
    "calibrated_tuner",
    "calibration_sizes",
    "collective_row",
    "measure_collective",
]

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8}

# Calibrated tuners of this rank process, by (world size, dtype, sizes, window, rounds): a
# rank pool runs every cell of one world size, so the auto cells of a grid calibrate once.
_TUNERS: dict[tuple, AllReduceTuner] = {}


@dataclass(frozen=True)
class CollectiveCall:
    """What a cell calls: the collective, whose implementation, and (all-reduce) how."""

    collective: str
    impl: str  # "distbench" or "torch"
    algorithm: str = "ring"


@dataclass(kw_only=True)
class TimedGridConfig:
    """Keys shared by every grid of timed collectives (subclasses add `message_bytes`)."""

    RANK_KEY: ClassVar[str] = "world_sizes"  # what `bench.config.check_host` bounds
    SIZE_KEYS: ClassVar[tuple[str, ...]] = ("message_bytes",)

    world_sizes: list[int] = ranks_key([2, 4, 8])
    """Numbers of ranks (N)."""
    dtype: str = "float32"
    """Element type of every message (a message size must be a whole number of them)."""
    repeats: int = iterations_key(5)
    """Timed windows per cell; the median is reported."""
    warmup: int = iterations_key(2, ge=0)
    """Untimed calls before the windows (connections made, buffers allocated)."""
    window_s: float = seconds_key(0.1)
    """Target length of one timed window; sets the calls per window."""
    max_iters: int = iterations_key(200)
    """At most this many calls per window."""
    paired: bool = True
    """Also time torch's collective on the same buffers, in windows alternating with ours,
    so the speed ratio is measured side by side (drift hits both alike)."""
    timeout_s: float = cell_timeout(300.0)
    """A cell whose ranks have not all finished by then is recorded as failed."""

    def __post_init__(self) -> None:
        check_positive("world_sizes", self.world_sizes)
        check_choice("dtype", self.dtype, list(DTYPE_BYTES))
        check_positive("message_bytes", self.message_bytes)
        size = DTYPE_BYTES[self.dtype]
        bad = [m for m in self.message_bytes if m % size]
        if bad:
            raise ValueError(
                f"message_bytes={bad} is not a multiple of the {self.dtype} element size "
                f"({size} bytes)"
            )
        check_positive("repeats", [self.repeats])
        check_positive("warmup", [self.warmup], minimum=0)
        check_positive("max_iters", [self.max_iters])
        for key in ("window_s", "timeout_s"):
            check_number(key, getattr(self, key))

    def rank_bytes(self) -> int:
        """An upper bound on one rank's allocation in the largest cell: its buffers and the
        known answer (3 S at most), and the int64 temporaries that build the test pattern
        (two int64 arrays of S / itemsize elements alive at once)."""
        size = max(self.message_bytes)
        return 3 * size + 16 * (size // DTYPE_BYTES[self.dtype])

    def auto_timing(self) -> tuple[float, int]:
        """(window seconds, rounds) of an auto cell and of its tuner's calibration: the
        grid's own, unless the experiment times auto cells apart."""
        return self.window_s, self.repeats


def measure_collective(cfg: TimedGridConfig, cell: Cell) -> dict[str, Any]:
    """One rank of a cell (all ranks of the default group call it together).

    Per cell, on every rank: warm-up calls; `iters` calibrated once so a window lasts about
    `window_s` (agreed on by all ranks: the slowest rank's probe, the median of three calls;
    paired sides share one count, `impls.pairing.common_count`); then `repeats` windows,
    the cell's own collective alternating with torch's on the same buffers when `paired`
    (`bench.kit.timing.alternate`, balanced: AB, BA, …). A window's time is the slowest
    rank's, per call; the reported time is the median window. Timed calls run on zeroed
    buffers (sums stay finite however many calls); then one more call on the known-answer
    pattern is checked (`wrong` counts the elements that differ) and its traffic read from
    the counters.
    """
    call: CollectiveCall = cell.carry
    comm = Communicator()
    spec = COLLECTIVES[call.collective]
    dtype = getattr(torch, cfg.dtype)
    if call.algorithm == "auto":
        comm.tuner = calibrated_tuner(cfg, comm)
    bufs = spec.build(comm, cell.key["message_bytes"] // dtype.itemsize, dtype, call.algorithm)
    own = bufs.run_distbench if call.impl == "distbench" else bufs.run_torch
    sides = {"time_s": own}
    if cfg.paired and call.impl == "distbench":
        sides["torch_time_s"] = bufs.run_torch
        if call.algorithm == "auto" and bufs.run_algorithm is not None:
            for name in comm.tuner.algorithms:  # what auto chooses from, side by side
                sides[f"alt_{name}_s"] = lambda name=name: bufs.run_algorithm(name)
    auto_sides = any(name.startswith("alt_") for name in sides)
    window_s, repeats = cfg.auto_timing() if auto_sides else (cfg.window_s, cfg.repeats)
    bufs.fill(False)
    iters = {}
    for name, step in sides.items():
        for _ in range(cfg.warmup):
            step()
        iters[name] = calibrate_iters(step, window_s, cfg.max_iters, comm.group)
    # Paired sides call equally often per window and take turns in a balanced order
    # (AB, BA, … for two), so a window's fixed costs and whatever one side leaves behind
    # fall on each side alike. With their own counts and a fixed order, ring ÷ torch at
    # N = 2, 4 MiB read 0.36x in CI and 0.65x here; 0.79–1.04x in seven runs after.
    iters = dict.fromkeys(sides, common_count(iters.values()))
    timed = alternate(
        sides, warmup=0, repeats=repeats, group=comm.group, iters=iters, balanced=len(sides) > 1
    )
    bufs.fill(True)
    comm.reset_counters()
    own()
    wrong = 0
    if bufs.expected is not None:
        wrong = int((bufs.result().cpu() != bufs.expected).sum().item())
    auto = {}
    if call.algorithm == "auto" and call.impl == "distbench":
        choice = comm.tuner.last_choice
        auto = {
            "auto_choice": choice,
            "auto_predicted_s": comm.tuner.predict(
                choice, cell.key["message_bytes"], comm.world_size
            ),
        }
        if auto_sides:
            auto["round_times_s"] = json.dumps({name: t.seconds for name, t in timed.items()})
    return {
        **{name: t.median for name, t in timed.items()},
        "iters": iters["time_s"],
        "wrong": wrong,
        **comm.counters.as_dict(),
        **auto,
    }


def calibration_sizes(message_bytes: list[int]) -> tuple[int, ...]:
    """Every size of the grid, ascending (a one-size grid: that size and 16 times it), so
    the tuner's table is measured at each size it will be asked about."""
    sizes = tuple(sorted(set(message_bytes)))
    return sizes if len(sizes) > 1 else (sizes[0], 16 * sizes[0])


def calibrated_tuner(cfg: TimedGridConfig, comm: Communicator) -> AllReduceTuner:
    """This process's tuner for `comm`'s world size, calibrated on first use (collective:
    every rank of the cell reaches it together).

    An all-reduce cell with `algorithm="auto"` first gives its communicator a tuner
    calibrated on this pool (`impls.collectives.AllReduceTuner.calibrate`, at every message
    size of the grid, once per world size and dtype in each rank process), then is timed
    like any other; its row names the algorithm the tuner chose. When paired, every
    algorithm the tuner chooses from also takes its turn in the same alternating windows on
    the same buffer (`alt_<algorithm>_s`), so auto is judged against the best of them
    measured beside it, not against other cells run in other phases of the host. Picking
    the best of six noisy sides needs more windows than a pairing with torch: the tuner's
    calibration and the auto cell run `auto_repeats` rounds of `auto_window_s` windows
    (configs without those keys: `repeats`, `window_s`), and the row keeps every round's
    time per side (`round_times_s`, JSON) so the report can pair them round by round.
    """
    sizes = calibration_sizes(cfg.message_bytes)
    window_s, repeats = cfg.auto_timing()
    key = (comm.world_size, cfg.dtype, sizes, window_s, repeats)
    if key not in _TUNERS:
        _TUNERS[key] = AllReduceTuner().calibrate(
            comm,
            sizes,
            dtype=getattr(torch, cfg.dtype),
            warmup=max(1, cfg.warmup),
            repeats=max(5, repeats),
            window_s=window_s,
            max_iters=cfg.max_iters,
        )
    return _TUNERS[key]


def collective_row(cell: Cell, per_rank: list[dict], traffic: bool) -> dict[str, Any]:
    """The tidy row of a timed collective: nccl-tests' columns plus traffic counters."""
    first = per_rank[0]
    size = cell.key["message_bytes"]
    factor = COLLECTIVES[cell.carry.collective].bus_factor(cell.world_size)
    algbw = size / first["time_s"] / 1e9 if first["time_s"] > 0 else math.nan
    torch_s = first.get("torch_time_s", math.nan)
    row = {
        **cell.key,
        "time_s": first["time_s"],
        "iters": first["iters"],
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * factor,
        "bus_factor": factor,
        "wrong": sum(r["wrong"] for r in per_rank),
        # Side by side with torch's collective (alternating windows, same buffers): the
        # busbw ratio equals the inverse time ratio, since both move the same S.
        "torch_time_s": torch_s,
        "busbw_vs_torch": torch_s / first["time_s"] if first["time_s"] > 0 else math.nan,
    }
    if "auto_choice" in first:  # the algorithm auto ran, and the time it predicted
        row["auto_choice"] = first["auto_choice"]
        row["auto_predicted_s"] = first["auto_predicted_s"]
        # each algorithm auto chooses from, timed in the same windows (paired cells)
        row |= {name: value for name, value in first.items() if name.startswith("alt_")}
        if "round_times_s" in first:  # every side's time per round (JSON), for pairing
            row["round_times_s"] = first["round_times_s"]
    counted = traffic and any(r["messages_sent"] or r["messages_recv"] for r in per_rank)
    no_traffic = cell.world_size == 1 or size == 0
    for column, value in {
        "rounds": max(r["rounds"] for r in per_rank),
        "max_rank_bytes_sent": max(r["bytes_sent"] for r in per_rank),
        "max_rank_bytes_recv": max(r["bytes_recv"] for r in per_rank),
        "total_bytes_sent": sum(r["bytes_sent"] for r in per_rank),
        "messages": max(r["messages_sent"] for r in per_rank),
    }.items():
        # torch's own collectives are opaque to our counters: NaN, never a made-up zero.
        row[column] = value if counted or (traffic and no_traffic) else math.nan
    return row
