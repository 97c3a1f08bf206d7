"""Timing as nccl-tests does it, run inside every rank of a cell.

Warm-up calls first; then `repeats` windows, each opened by a barrier and holding
`iters` back-to-back calls; a window's time is the slowest rank's (the collective is
done only when every rank is done), and the reported time is the median window. `iters`
is calibrated once so a window lasts about `window_s`, and agreed on by all ranks.
With `paired`, torch's own collective is timed in windows alternating with ours on the
same buffers, and the ratio of the two medians is the speed comparison the reports lead
with. Timed calls run on zeroed buffers (sums stay finite however many calls), then one more
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

__all__ = ["CollectiveCell", "measure_collective", "slowest"]


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
    paired: bool = True
    """Also time torch's collective on the same buffers, in windows alternating with ours,
    so the speed ratio is measured side by side (machine drift hits both alike)."""


def slowest(seconds: float, group=None) -> float:
    """The largest of every rank's `seconds` (the slowest rank sets a step's time)."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _timed_window(call, iters: int, group) -> float:
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        call()
    return slowest((time.perf_counter() - start) / iters, group)


def measure_collective(cell: CollectiveCell) -> dict:
    """Run one cell on this rank (all ranks of the default group call it together)."""
    comm = Communicator()
    group = comm.group
    spec = COLLECTIVES[cell.collective]
    dtype = getattr(torch, cell.dtype)
    numel = cell.message_bytes // dtype.itemsize
    bufs = spec.build(comm, numel, dtype, cell.algorithm)
    call = bufs.run_distbench if cell.impl == "distbench" else bufs.run_torch
    calls = {"time_s": call}
    if cell.paired and cell.impl == "distbench":
        calls["torch_time_s"] = bufs.run_torch

    bufs.fill(False)
    iters = {}
    for name, fn in calls.items():
        for _ in range(cell.warmup):
            fn()
        probe = _timed_window(fn, 1, group)
        iters[name] = max(1, min(cell.max_iters, math.ceil(cell.window_s / max(probe, 1e-9))))
    windows: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(cell.repeats):
        for name, fn in calls.items():
            windows[name].append(_timed_window(fn, iters[name], group))

    bufs.fill(True)
    comm.reset_counters()
    call()
    result = bufs.result()
    wrong = 0
    if bufs.expected is not None:
        wrong = int((result.cpu() != bufs.expected).sum().item())
    return {
        **{name: statistics.median(times) for name, times in windows.items()},
        "iters": iters["time_s"],
        "wrong": wrong,
        **comm.counters.as_dict(),
    }
