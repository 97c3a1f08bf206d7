"""Timing as nccl-tests does it, run inside every rank of a cell.

Warm-up calls first; then `repeats` windows, each opened by a barrier and holding
`iters` back-to-back calls; a window's time is the slowest rank's (the collective is
done only when every rank is done), and the reported time is the median window. `iters`
is calibrated once so a window lasts about `window_s`, and agreed on by all ranks.
Timed calls run on zeroed buffers (sums stay finite however many calls), then one more
call on the known-answer pattern is checked and counted (`wrong`) and its traffic read.

The harness itself (barriers, max over ranks) uses torch.distributed's collectives:
they bracket the measured window and are the same for every implementation compared.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from bench.collective_specs import COLLECTIVES
from impls.comm import Communicator

__all__ = ["CollectiveCell", "measure_collective"]


@dataclass(kw_only=True)
class CollectiveCell:
    """One measured configuration: what to run, on how many bytes, and how long to time it."""

    collective: str
    impl: str  # "distbench" or "torch"
    algorithm: str = "ring"  # all_reduce only
    message_bytes: int
    dtype: str = "float32"
    warmup: int = 2
    repeats: int = 5
    window_s: float = 0.1
    max_iters: int = 200


def _slowest(seconds: float, group) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _timed_window(call, iters: int, group) -> float:
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        call()
    return _slowest((time.perf_counter() - start) / iters, group)


def measure_collective(cell: CollectiveCell) -> dict:
    """Run one cell on this rank (all ranks of the default group call it together)."""
    comm = Communicator()
    group = comm.group
    spec = COLLECTIVES[cell.collective]
    dtype = getattr(torch, cell.dtype)
    numel = cell.message_bytes // dtype.itemsize
    bufs = spec.build(comm, numel, dtype, cell.algorithm)
    call = bufs.run_distbench if cell.impl == "distbench" else bufs.run_torch

    bufs.fill(False)
    for _ in range(cell.warmup):
        call()
    probe = _timed_window(call, 1, group)
    iters = max(1, min(cell.max_iters, math.ceil(cell.window_s / max(probe, 1e-9))))
    windows = [_timed_window(call, iters, group) for _ in range(cell.repeats)]

    bufs.fill(True)
    comm.reset_counters()
    call()
    result = bufs.result()
    wrong = 0
    if bufs.expected is not None:
        wrong = int((result.cpu() != bufs.expected).sum().item())
    return {
        "time_s": statistics.median(windows),
        "iters": iters,
        "wrong": wrong,
        **comm.counters.as_dict(),
    }
